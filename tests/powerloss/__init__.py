"""Power-loss tests: a FUSE filesystem that drops what was not fsynced (lossy_fs.py) and their self-tests."""
