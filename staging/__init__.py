"""The staging region and the file formats under it: layout constants, typed views, poison,
binary records, the result file's section table, token streams, and the error convention
(`coppelius.staging.errors`, the lowest layer: staging imports nothing from plan or host)."""
