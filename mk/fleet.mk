# A fleet: one dataset over the inventory's containers, one shard each (docs/fleet.md).
#   make merge [INVENTORY=DIR] [MERGE_INTO=DIR] [MERGE_SHARED=yes] [MERGE_ARGS=...]
# gathers every shard's output (hsx_output_dir) over SSH into MERGE_INTO.shards/<host> (rsync when both
# ends have it, else a tar stream; rerun it and only what changed moves), then runs `hsextract merge`
# into MERGE_INTO and verifies it. MERGE_SHARED=yes: the outputs sit on a shared filesystem (NFS, CephFS)
# mounted here at the same paths, so they are merged in place (hard links, nothing copied).
# MERGE_ARGS passes more flags, e.g. MERGE_ARGS="--copy" or "--ssh-option StrictHostKeyChecking=accept-new".

MERGE_INTO ?= $(WORK)/merged
MERGE_SHARED ?=
MERGE_ARGS ?=

.PHONY: merge

_merge_inventory = $(or $(INVENTORY),$(if $(HSX_INVENTORY_CONFIGURED),$(HSX_INVENTORY)))

merge: setup setup-ansible  ## gather the shards' outputs (SSH, or in place with MERGE_SHARED=yes) and merge them into MERGE_INTO
	@if [ -z "$(_merge_inventory)" ]; then \
	  echo "ConfigError: make merge needs an inventory: INVENTORY=DIR (or ansible.cfg's, once no CHANGE_ME is left);" \
	    "for directories on this machine run .venv/bin/hsextract merge SHARD_OUT... --into OUT" >&2; exit 2; fi
	$(BIN)/hsextract merge --inventory $(_merge_inventory) --ansible-inventory $(ANSIBLE_VENV)/bin/ansible-inventory \
	  --into $(MERGE_INTO) $(if $(filter yes true 1,$(MERGE_SHARED)),--shared) $(MERGE_ARGS)

# make regenerate [INVENTORY=DIR] [REGEN_INTO=FILE] [REGEN_MERGE_ARGS=...]
# runs playbooks/regenerate.yml (every container regenerates its shard of hsx_regen_dataset with its own server,
# followed to its end), then gathers each shard (hsx_regen_output and its journal) over SSH into
# REGEN_INTO.shards/<host> and joins them in input order into REGEN_INTO (hsextract merge-regenerated). Rerun it
# after any failure: finished shards say ALREADY COMPLETE, the others resume. REGEN_MERGE_ARGS passes more flags,
# e.g. "--ssh-option StrictHostKeyChecking=accept-new".
REGEN_INTO ?= $(WORK)/regenerated.jsonl
REGEN_MERGE_ARGS ?=

.PHONY: regenerate

regenerate: setup setup-ansible  ## regenerate the answers on the inventory's containers (one shard each), then merge them in input order into REGEN_INTO
	@if [ -z "$(_merge_inventory)" ]; then \
	  echo "ConfigError: make regenerate needs an inventory: INVENTORY=DIR (or ansible.cfg's, once no CHANGE_ME is left);" \
	    "against a server of this machine run .venv/bin/hsextract regenerate, or make pipeline (docs/regenerate.md)" >&2; exit 2; fi
	$(_ANSIBLE_PLAYBOOK) playbooks/regenerate.yml $(ANSIBLE_ARGS)
	$(BIN)/hsextract merge-regenerated --inventory $(_merge_inventory) --ansible-inventory $(ANSIBLE_VENV)/bin/ansible-inventory \
	  --into $(REGEN_INTO) $(REGEN_MERGE_ARGS)

# make takeover TAKEOVER_HOST=host TAKEOVER_SHARD=I TAKEOVER_OUTPUT=DIR [HSX_EXTRACT_WAIT=true]
# finishes shard I of a container lost for good on TAKEOVER_HOST (its own shard done), resuming from what
# the lost shard wrote, put at TAKEOVER_OUTPUT on that host (playbooks/takeover.yml; docs/fleet.md).
TAKEOVER_HOST ?=
TAKEOVER_SHARD ?=
TAKEOVER_OUTPUT ?=

.PHONY: takeover

takeover: setup-ansible  ## finish a lost container's shard on another: TAKEOVER_HOST= TAKEOVER_SHARD= TAKEOVER_OUTPUT=
	$(_ANSIBLE_PLAYBOOK) playbooks/takeover.yml --limit "$(TAKEOVER_HOST)" -e hsx_takeover_shard="$(TAKEOVER_SHARD)" \
	  -e hsx_takeover_output="$(TAKEOVER_OUTPUT)" -e hsx_extract_wait=$(HSX_EXTRACT_WAIT) $(ANSIBLE_ARGS)
