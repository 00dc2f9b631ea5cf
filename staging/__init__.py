"""The staging region: layout constants, typed views, poison, binary records and input records."""
