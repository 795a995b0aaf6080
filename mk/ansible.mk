# Deployment with Ansible (included by the top Makefile). See docs/deploy.md.
#
#   make deploy            ansible-playbook deploy.yml           (INVENTORY=dir overrides ansible.cfg's; docs/deploy.md)
#   make restart           ansible-playbook playbooks/restart.yml
#   make ansible-extract   ansible-playbook playbooks/extract.yml (HSX_EXTRACT_WAIT=true follows it)
#   make ansible-status    ansible-playbook playbooks/status.yml
#   make test-deploy       the real-LXC deployment test (root; builds a container on this machine)
#   make lint-ansible      ansible-lint (production profile) and --syntax-check
#
# HSX_INVENTORY_CONFIGURED is "yes" when no value of the inventory in use is still the CHANGE_ME placeholder
# (scripts/inventory-configured.py reads the values: the comments of inventory/example mention CHANGE_ME too):
# `make extract` runs the extraction through Ansible then, and the embedded default otherwise.

ANSIBLE_VENV ?= .venv-ansible
ANSIBLE_BIN := $(ANSIBLE_VENV)/bin
INVENTORY ?=
ANSIBLE_ARGS ?=
HSX_EXTRACT_WAIT ?= false
HSX_INVENTORY := $(or $(INVENTORY),$(shell sed -n 's/^inventory *= *//p' ansible.cfg 2>/dev/null))
# a Python with PyYAML: the Ansible venv's, else .venv's, else the system's (the script scans lines without it)
_HSX_INVENTORY_PYTHON := $(firstword $(wildcard $(ANSIBLE_BIN)/python $(VENV)/bin/python) python3)
HSX_INVENTORY_CONFIGURED := $(if $(HSX_INVENTORY),$(shell $(_HSX_INVENTORY_PYTHON) scripts/inventory-configured.py "$(HSX_INVENTORY)" 2>/dev/null && echo yes),)
_ANSIBLE_PLAYBOOK = ANSIBLE_CONFIG=ansible.cfg $(ANSIBLE_BIN)/ansible-playbook $(if $(INVENTORY),-i $(INVENTORY))
DEPLOY_PYTEST_ARGS ?= -ra

.PHONY: setup-ansible deploy restart ansible-extract ansible-status test-deploy lint-ansible

setup-ansible: $(ANSIBLE_VENV)/.setup-done  ## .venv-ansible: ansible-core, ansible-lint, pytest (pinned)

$(ANSIBLE_VENV)/.setup-done: requirements-ansible.txt scripts/lxc/setup-ansible-venv.sh
	scripts/lxc/setup-ansible-venv.sh $(ANSIBLE_VENV)

deploy: setup-ansible  ## create (pct create, when its VMID does not exist) and configure the container(s), start the server (ansible-playbook deploy.yml)
	$(_ANSIBLE_PLAYBOOK) deploy.yml $(ANSIBLE_ARGS)

restart: setup-ansible  ## restart the server: reclaim its port, wait for HTTP 200
	$(_ANSIBLE_PLAYBOOK) playbooks/restart.yml $(ANSIBLE_ARGS)

ansible-extract: setup-ansible  ## start the extraction job in the container(s)
	$(_ANSIBLE_PLAYBOOK) playbooks/extract.yml -e hsx_extract_wait=$(HSX_EXTRACT_WAIT) $(ANSIBLE_ARGS)

ansible-status: setup-ansible  ## server health, units, /dev/shm and disk use of the container(s)
	$(_ANSIBLE_PLAYBOOK) playbooks/status.yml $(ANSIBLE_ARGS)

lint-ansible: setup-ansible  ## ansible-lint (production profile) and syntax checks
	ANSIBLE_CONFIG=ansible.cfg $(ANSIBLE_BIN)/ansible-lint --offline
	for p in deploy.yml playbooks/restart.yml playbooks/extract.yml playbooks/status.yml playbooks/takeover.yml playbooks/regenerate.yml; do \
	  ANSIBLE_CONFIG=ansible.cfg $(ANSIBLE_BIN)/ansible-playbook --syntax-check $$p >/dev/null; done

test-deploy: setup-ansible setup-sglang monitoring-deps  ## deployment tests: lint, roles, and deploy.yml against a real LXC container (embedded runtime and the real SGLang server)
	scripts/lxc/install-host-deps.sh
	$(ANSIBLE_BIN)/python -m pytest --confcutdir=tests/deploy -p no:cacheprovider $(DEPLOY_PYTEST_ARGS) tests/deploy
