# Entry points for people and CI (.ci/run -> scripts/test.sh, which includes the peer tier).
.PHONY: test lint peer peer-venvs bench

# Everything: set up, boot the systemd test host, run all tests (unit, hosts, peer tier).
test:
	bash scripts/test.sh $(PYTEST_ARGS)

# The linters alone (ruff, yamllint, ansible-lint production profile; also a phase of `test`, after setup).
lint:
	bash scripts/lint.sh

# The peer tier alone: build/reuse the cached real-SGLang venvs, run tests/peer.
peer:
	bash scripts/peer.sh $(PYTEST_ARGS)

# Only build/reuse the cached real-SGLang venvs the peer tier needs.
peer-venvs:
	bash scripts/peer.sh --venvs

# Speed, side by side in one run (figures in docs/performance.md): controller commands vs ansible-inventory at
# 1/10/100/1000 hosts and --help; the exporter vs a bare prometheus_client server; the warmup
# client's CPU per request; the bench client's CPU per token and ITL error beside SGLang's
# bench_serving (needs the cached SGLang 0.5.23 venv: make peer-venvs). Prints figures (not tests).
bench:
	.venv/bin/python scripts/bench-controller.py
	.venv/bin/python scripts/bench-exporter.py
	.venv/bin/python scripts/bench-warmup.py
	.venv/bin/python scripts/bench-client.py
