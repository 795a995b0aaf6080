# Power-loss tests (tests/powerloss): a FUSE filesystem that drops what was not fsynced, the tests'
# stand-in for LazyFS (tests/powerloss/lossy_fs.py). It runs on Debian's libfuse3 through mfusepy, which
# `make setup` installs into .venv (requirements-dev.txt, pinned in constraints.txt).
#   make powerloss-deps   fuse3 (fusermount3, libfuse3) and libfuse3-dev from Debian, when missing (root)
# The tests mount, so they also need root and /dev/fuse (a container must be given the device).

.PHONY: powerloss-deps

powerloss-deps:  ## Debian's fuse3 and libfuse3-dev for the power-loss tests' FUSE filesystem (root)
	@if command -v fusermount3 >/dev/null 2>&1 && /sbin/ldconfig -p | grep 'libfuse3\.so' >/dev/null; then \
	  echo "powerloss deps present: $$(fusermount3 --version 2>&1 | head -n1)"; \
	elif [[ $$EUID -ne 0 ]]; then \
	  echo "error: installing fuse3 libfuse3-dev needs root; run as root: make powerloss-deps" >&2; exit 1; \
	else \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq; \
	  apt-get install -y -qq --no-install-recommends fuse3 libfuse3-dev >/dev/null; \
	  echo "installed fuse3 libfuse3-dev: $$(fusermount3 --version 2>&1 | head -n1)"; \
	fi
	@test -e /dev/fuse || { echo "error: /dev/fuse is missing: modprobe fuse on the host, or give the container /dev/fuse" >&2; exit 1; }
