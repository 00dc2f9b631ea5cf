"""`python -m coppelius.cli COMMAND`: the console script `coppelius` without its wrapper."""
import sys

from coppelius.cli import main

sys.exit(main())
