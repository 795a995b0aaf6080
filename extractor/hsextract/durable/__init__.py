"""Files that survive a crash: every command writes through here.

- ``atomic``: a temp name beside the target, then ``os.replace`` (never a half-written file under the
  real name), the temp names a later run sweeps, and what a full disk looks like in an error;
- ``sync``: ``fsync`` of a file, a handle, a folder;
- ``lock``: one writer per output (an ``flock`` the kernel drops when its holder dies).

Imports nothing of hsextract but ``errors``: ``contract`` and every command sit above it.
"""
