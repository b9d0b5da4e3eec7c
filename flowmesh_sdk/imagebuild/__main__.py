"""``python -m flowmesh_sdk.imagebuild``: build and push the project's images."""

import sys

from .build import main

sys.exit(main())
