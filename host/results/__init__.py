"""The files a run leaves: the result file (its writer and reader), the per-launch digests file,
and the telemetry file beside the result (telemetry_file).
"""
