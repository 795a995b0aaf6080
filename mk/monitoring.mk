# Monitoring: status and logs of the extraction hosts, and the Prometheus/Grafana checks.
#   make status [INVENTORY=DIR]          server health, units, /dev/shm and disk, progress and ETA
#   make logs [INVENTORY=DIR] [LINES=N]  the same plus the units' last log lines
#   make monitoring-rules                render the alert rules template with hsx_monitoring's defaults
# The hosts are those of INVENTORY, else of the inventory ansible.cfg names once it is configured
# (no CHANGE_ME left; see mk/ansible.mk); with neither they look at this machine (`make extract`'s
# embedded default) where `make extract` runs it: the same HSX_PORT, HSX_METRICS_PORT, HSX_DUMP_DIR, OUTPUT
# (default WORK/output) as scripts/run-default.sh, and `make logs` shows its server log, WORK/server.log.
# STATUS_ARGS passes more flags, e.g. STATUS_ARGS=--json (hsextract status --help); they override those.

INVENTORY ?=
LINES ?= 50
STATUS_ARGS ?=
ANSIBLE_VENV ?= .venv-ansible
PROMTOOL ?= promtool
# Where `make monitoring-rules` writes; the repository's copy is what the promtool unit tests load.
MONITORING_RULES_DIR ?= monitoring/prometheus/rules

.PHONY: status logs test-monitoring monitoring-deps monitoring-rules

_status_inventory = $(or $(INVENTORY),$(if $(HSX_INVENTORY_CONFIGURED),$(HSX_INVENTORY)))
# this machine: what scripts/run-default.sh (make extract) takes; hsextract status's defaults are the script's
_status_local = $(if $(HSX_PORT),--server-port $(HSX_PORT)) $(if $(HSX_METRICS_PORT),--metrics-port $(HSX_METRICS_PORT)) \
	--output-dir $(or $(OUTPUT),$(WORK)/output) $(if $(HSX_DUMP_DIR),--dump-dir $(HSX_DUMP_DIR))
_status = $(BIN)/hsextract status $(if $(_status_inventory),--inventory $(_status_inventory) \
	--ansible-inventory $(ANSIBLE_VENV)/bin/ansible-inventory,$(_status_local))

status: setup $(if $(_status_inventory),setup-ansible)  ## health, units, /dev/shm, disk, progress and ETA of the hosts (read-only)
	$(_status) $(STATUS_ARGS)

logs: setup $(if $(_status_inventory),setup-ansible)  ## status plus the last LINES log lines of the server and extractor units (no inventory: of WORK/server.log)
	$(_status) --logs $(LINES) $(if $(_status_inventory),,--log-file $(WORK)/server.log) $(STATUS_ARGS)

monitoring-deps:  ## Debian's prometheus (promtool) and openssh-server for the monitoring tests (root)
	scripts/monitoring/install-deps.sh

test-monitoring: setup monitoring-deps  ## promtool checks and rule tests, dashboard, runbooks, status, live Prometheus e2e
	$(PROMTOOL) check config monitoring/prometheus/prometheus.yml
	$(PROMTOOL) check rules monitoring/prometheus/rules/*.yml
	$(PROMTOOL) test rules monitoring/prometheus/tests/*.yml
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests/monitoring

# The same template and variables the role hsx_monitoring renders on the monitoring hosts, rendered by Ansible
# itself with the role's defaults, so the repository's copy is byte for byte what the role installs by default.
monitoring-rules: setup-ansible  ## after editing the alerts template (monitoring/prometheus/rules/*.yml.j2): render its defaults copy
	@for template in monitoring/prometheus/rules/*.yml.j2; do \
	  out=$(abspath $(MONITORING_RULES_DIR))/$$(basename "$${template%.j2}"); \
	  ANSIBLE_CONFIG=ansible.cfg $(ANSIBLE_BIN)/ansible localhost -c local -m ansible.builtin.template \
	    -e ansible_python_interpreter=$(abspath $(ANSIBLE_BIN))/python -e @roles/hsx_monitoring/defaults/main.yml \
	    -a "src=$(CURDIR)/$$template dest=$$out mode=0644" >/dev/null; \
	  echo "rendered $$out"; done
