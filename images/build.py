#!/usr/bin/env python3
"""``python images/build.py ...`` in a checkout: the same as ``python -m flowmesh_sdk.imagebuild``.
The image definitions and the builder live in the package (:mod:`flowmesh_sdk.imagebuild`)
so an installed wheel has them; import that module rather than loading this file."""

import sys

from flowmesh_sdk.imagebuild.build import main

if __name__ == "__main__":
    sys.exit(main())
