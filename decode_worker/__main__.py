import sys

from decode_worker import main

sys.exit(main())
