"""The driver wrapper: every CUDA driver call, its rule (`calls`), the device and memory
(`device`), streams, events and graphs (`stream`), PTX modules and kernels (`module`).

Imports go one way, with no circle: `calls` (on coppelius.errors alone) ← `stream` ← `device`,
`module`; nothing here imports the backends.
"""
