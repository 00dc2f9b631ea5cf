"""The committed PTX (CONTRACT §12): `<profile>/<target>/` holds each kernel's PTX file and the
manifest that names it, as tools/build_ptx.py writes them; the cuda backend loads them from here
(host/backends/cuda/ptx.py).  Data only: this file makes the folder the package
`coppelius.kernels_ptx`, found the same way in a checkout, an editable install and a wheel."""
