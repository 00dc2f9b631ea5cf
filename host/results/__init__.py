"""The files a run leaves: the result file (its writer and reader) and the per-launch digests file.
"""
