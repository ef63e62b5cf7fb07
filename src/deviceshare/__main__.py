import sys

from deviceshare.cli import main

sys.exit(main())
