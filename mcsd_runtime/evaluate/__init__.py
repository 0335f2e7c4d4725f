"""End-to-end evaluation: interleaved runs, statistics, reports, output quality."""
