# Entry points for people and CI (.ci/run -> scripts/test.sh, which includes the peer tier).
.PHONY: test peer peer-venvs

# Everything: set up, boot the systemd test host, run all tests (unit, hosts, peer tier).
test:
	bash scripts/test.sh $(PYTEST_ARGS)

# The peer tier alone: build/reuse the cached real-SGLang venvs, run tests/peer.
peer:
	bash scripts/peer.sh $(PYTEST_ARGS)

# Only build/reuse the cached real-SGLang venvs the peer tier needs.
peer-venvs:
	bash scripts/peer.sh --venvs
