"""torchdata 0.9's ``datapipes.iter.util.webdataset`` module: the ``webdataset()`` stage's own module.

0.9 code replaces ``pathsplit`` here to change how members group into samples; this path is the
module that defines the stage (``shardpipes.datapipes.iter.webdataset``), so a replacement is
seen by the stage, as it was in 0.9.
"""

import sys

from shardpipes.datapipes.iter import webdataset as _stage_module

sys.modules[__name__] = _stage_module
