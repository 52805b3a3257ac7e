"""`python -m deploy` is `python -m deploy.launch`."""

import sys

from deploy.launch import main

sys.exit(main())
