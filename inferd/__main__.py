import sys

from .cli import main

if __name__ == "__main__":  # (not when a process `inferd plan` starts imports it)
    sys.exit(main())
