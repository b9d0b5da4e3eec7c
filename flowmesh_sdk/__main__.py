"""``python -m flowmesh_sdk``: the ``flowmesh`` command."""

from .cli.main import main

if __name__ == "__main__":
    main()
