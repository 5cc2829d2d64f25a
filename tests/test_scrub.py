"""``errors.scrub``: the shapes a secret takes in echoed text (log lines ``diagnose`` quotes, a
resolver's stderr, findings), one test per shape, and its time on hostile 1 MB lines.

Shapes that once got through: a bare Hugging Face token, ``--api-key VALUE`` argv,
``export NAME="VALUE"``, SGLang's ``ServerArgs(api_key='VALUE')`` repr, JSON ``"hf_token": "VALUE"``,
``NAME = VALUE``, ``token: VALUE``."""

from __future__ import annotations

import time

import pytest

from ddtree_ops.config.errors import REDACTED, scrub

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"  # 34 letters/digits after hf_, as huggingface.co issues them


@pytest.mark.parametrize("text, secret", [
    (f"loading with {HF} from cache", HF),
    ("key sk-proj-Abcdefghijklmnopqrstuvwxyz0123 in env", "sk-proj-Abcdef"),
    ("sk-ant-api03-Abcdefghijklmnopqrstuvwxyz", "sk-ant-api03"),
    ("clone with ghp_" + "a1" * 18, "ghp_a1"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "github_pat_11"),
    ("slack xoxb-1234567890-abcdefghij", "xoxb-1234"),
    ("glpat-Abcdefghij0123456789", "glpat-Abc"),
])
def test_well_known_token_shapes_are_redacted_wherever_they_stand(text, secret):
    out = scrub(text)
    assert secret not in out and REDACTED in out


def test_words_that_merely_start_like_tokens_stay():
    for text in ("task-abcdefghijklmnopqrstuvwxyz", "hf_token is not set", "ask-me", "my_hf_short"):
        assert scrub(text) == text


@pytest.mark.parametrize("text, secret, kept", [
    ("argv: --api-key SEKRITargv --port 1", "SEKRITargv", "--port 1"),
    ("--admin-api-key sekritadmin --host 0.0.0.0", "sekritadmin", "--host 0.0.0.0"),
    ("--hf-token 'quoted1' --x", "quoted1", "--x"),
    ('export OPENAI_API_KEY="SEKRITquoted"', "SEKRITquoted", "export OPENAI_API_KEY="),
    ("ServerArgs(model_path='m', api_key='SEKRITpyrepr', port=30000)", "SEKRITpyrepr", "port=30000"),
    ('args={"hf_token": "SEKRITjson", "x": 1}', "SEKRITjson", '"x": 1'),
    ('{"MESSAGE":"ServerArgs {\\"api_key\\": \\"SEKRITesc\\"}"}', "SEKRITesc", "MESSAGE"),
    ("HF_TOKEN = SEKRITspaced ; api-key SEKRITdash", "SEKRIT", "HF_TOKEN = "),
    ("token: SEKRITtok", "SEKRITtok", "token: "),
    ("DB_PASSWORD : 'two words'", "two words", "DB_PASSWORD"),
    # Shapes that the first patterns left open: a bytes repr, an escaped quote inside a JSON string,
    # a Perl/Ruby hash arrow, a lower-case "password:" before a plain word.
    ("ServerArgs(api_key=b'SEKRITbytes', port=1)", "SEKRITbytes", "port=1"),
    ('{"api_key": "ab\\"SEKRITafterquote", "x": 1}', "SEKRITafterquote", '"x": 1'),
    ("{ api_key => 'SEKRITarrow', port => 1 }", "SEKRITarrow", "port => 1"),
    ("{ :api_key => SEKRITarrow2 }", "SEKRITarrow2", "{ :"),
    ("password: hunter", "hunter", "password: "),
    ("passphrase = correcthorse", "correcthorse", "passphrase"),
    ('{"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBg\\n-----END PRIVATE KEY-----\\n", "x": 1}',
     "MIIEvQIBADANBg", '"x": 1'),
])
def test_named_values_in_every_shape_are_redacted(text, secret, kept):
    out = scrub(text)
    assert secret not in out and REDACTED in out and kept in out


@pytest.mark.parametrize("text", [
    "a secret: it", "HF_TOKEN is not set", "--api-key --port 30000", "HF_TOKEN missing", "tokens: 5",
    "draft_tokens_per_req = 8", "the api-key header was missing",
])
def test_prose_and_non_secret_values_stay(text):
    assert scrub(text) == text


# Hostile lines of ~1 MB: (prefix, repeated unit, count for 1 MB, suffix).
HOSTILE = {
    "name runs": ("", "a1", 500_000, ""), "dotted": ("", "a.", 500_000, ""), "sk- runs": ("", "sk-", 340_000, ""),
    "hf_ runs": ("", "hf_", 340_000, ""), "names and values": ("", "A_KEY xY1234567 ", 60_000, ""),
    "open quotes": ("", "'a_key': '", 100_000, ""), "argv flags": ("", "--api-key ", 100_000, ""),
    "colons": ("", "token: ", 150_000, ""), "escaped quotes": ("", '\\"k_key\\":', 150_000, ""),
    "one long name": ("", "x", 1_000_000, "_token=v"), "quoted runs": ("", "keys: 'x ", 120_000, ""),
    "escapes": ("a_key='", "\\n", 500_000, ""),
}


def _cpu_seconds(line: str) -> float:
    """Best of two CPU-time measurements of one scrub (CPU time: other load on the machine
    does not count, where wall time would)."""
    best = float("inf")
    for _ in range(2):
        t = time.process_time()
        scrub(line)
        best = min(best, time.process_time() - t)
    return best


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_scrub_is_linear_on_hostile_1mb_lines(name):
    """Each of these took minutes before (a name run retried from every position). Measured side
    by side in one run: four times the input (256 KB -> 1 MB) costs about four times the CPU
    (measured 2.5x-6x), not sixteen. Smaller inputs are not used: below ~250 KB the regex
    engine's cost per character is not yet steady (62 KB -> 125 KB cost 5x for one case)."""
    prefix, unit, count, suffix = HOSTILE[name]
    small = _cpu_seconds(prefix + unit * (count // 4) + suffix)
    full = _cpu_seconds(prefix + unit * count + suffix)
    # A floor of 5 ms on the small side: below it the ratio is timer noise, and such a case is
    # fast in absolute terms too (a quadratic scan of 1 MB costs seconds, not tens of ms).
    ratio = full / max(small, 0.005)
    assert ratio < 10, f"{name}: {full:.3f} s CPU for 4x the input of {small:.3f} s (x{ratio:.1f}): not linear"


@pytest.mark.parametrize("text, secret", [
    ("auth eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c ok",
     "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),
    ("key id AKIAIOSFODNN7EXAMPLE in the log", "AKIAIOSFODNN7EXAMPLE"),
    ("private_key: -----BEGIN PRIVATE KEY-----MIIEvQIBADANBgkqhkiG9w0BAQEFAASC-----END PRIVATE KEY-----",
     "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
    ("Authorization: ApiKey SEKRITapikey123", "SEKRITapikey123"),
])
def test_jwt_aws_pem_and_apikey_shapes_are_redacted_and_refused_as_values(text, secret):
    """JWTs, AWS key ids, PEM bodies and the ApiKey scheme came out verbatim."""
    from ddtree_ops.config.errors import looks_like_token

    assert secret not in scrub(text)
    if "ApiKey" not in text:
        assert looks_like_token(text) is not None


@pytest.mark.parametrize("host", ["monkey-01", "turkey-01", "host-key-01", "token-ring-01", "pass-01", "auth-01"])
def test_a_host_name_never_eats_the_field_of_its_findings(host):
    """'monkey-01: ddtree_sglang.repo = None' was scrubbed as a secret named monkey-01."""
    from ddtree_ops.config.errors import Finding

    line = Finding("warning", "ddtree_sglang.repo", None, "must be x", "fix it", host=host).message()
    assert line == f"{host}: ddtree_sglang.repo = None: must be x. Fix: fix it"
    line = Finding("warning", "ddtree_service.name", "monkey", "must be x", "fix it", host=host).message()
    assert line == f"{host}: ddtree_service.name = 'monkey': must be x. Fix: fix it"


def test_a_token_shaped_host_name_is_still_redacted():
    from ddtree_ops.config.errors import Finding

    line = Finding("error", "inventory_hostname", None, "r", "f", host="sk-" + "a1B2c3D4" * 5).message()
    assert "a1B2c3D4" not in line and REDACTED in line


# The authorization scheme words are English too: a rule's text ("a 1-token generation", "paste the token
# alone") lost its next word. Only a credential-shaped word after one goes, or any word after an
# Authorization header; the preflight zipapp's standard-library scrub follows the same rule.
_PROSE_AFTER_SCHEME = [
    "health probes under 3 s flap (SGLang's /health runs a 1-token generation, ~1 s at best)",
    "paste the token alone, without quotes or a trailing newline",
    "the token file is read once; a basic check follows; digest mismatch means a broken download",
    "Bearer tokens are not needed for /health",
]
_CREDENTIALS_AFTER_SCHEME = [
    ("Bearer SEKRITsmi", "SEKRITsmi"), ("Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"), ("token abc123def", "abc123def"),
    ("curl -H 'Authorization: Token lowercaseonly'", "lowercaseonly"),
    ("token " + "q" * 30, "q" * 30), ("Bearer abc~def", "abc~def"),
]


@pytest.mark.parametrize("text", _PROSE_AFTER_SCHEME)
def test_words_after_an_authorization_scheme_word_stay_when_they_are_prose(text):
    from ddtree_ops._core.scrub import scrub_text

    assert scrub(text) == text
    assert scrub_text(text) == text


@pytest.mark.parametrize("text, secret", _CREDENTIALS_AFTER_SCHEME)
def test_credentials_after_an_authorization_scheme_word_are_still_redacted(text, secret):
    from ddtree_ops._core.scrub import scrub_text
    from ddtree_ops.config.errors import value_secret_reason

    assert secret not in scrub(text) and REDACTED in scrub(text)
    assert secret not in scrub_text(text) and REDACTED in scrub_text(text)
    assert value_secret_reason(text) is not None


def test_a_rule_that_says_token_prints_whole():
    """The finding for a 1 s health timeout printed "a 1-token (redacted), ~1 s at best"."""
    from ddtree_ops.config.errors import Finding

    f = Finding("warning", "ddtree_ops.health_timeout_s", 1,
                "health probes under 3 s flap (SGLang's /health runs a 1-token generation, ~1 s at best)",
                "paste the token alone")
    assert "1-token generation, ~1 s" in f.message() and "paste the token alone" in f.message()
    assert REDACTED not in f.message()


# Shapes that got through both scrubbers: a header-ish secret key before the scheme word, an all-lower-case
# Bearer credential, an hf_ token glued to the text before it (a letter, an ANSI escape's last letter).
# Each runs through errors.scrub and the preflight zipapp's standard-library copy: they must agree.
_GAPS = [
    ("token: Bearer abcdefghijkl", "abcdefghijkl", "token: Bearer "),
    ("X-Auth-Token: Bearer lowercasecred", "lowercasecred", "X-Auth-Token: Bearer "),
    ("proxy_auth = Basic dXNlcg", "dXNlcg", "proxy_auth"),
    ("rejected: bearer abcdefghijklmnopqrstuvw", "abcdefghijklmnopqrstuvw", "rejected: bearer "),
    ("Bearer onlylowercaseletters here", "onlylowercaseletters", " here"),
    ("x" + HF + " end", HF[3:], " end"),
    ("\x1b[2J" + HF, HF[3:], "\x1b[2J"),
    ("id=xhf_CANARYnewcomer3xyz", "CANARYnewcomer3xyz", "id="),
    ("model m-" + HF, HF[3:], "model m-"), ("DDTREE_" + HF, HF[3:], "DDTREE_"),
]
_GAP_PROSE = ["Bearer tokens are not needed for /health", "bearer authentication is configured upstream",
              "my_hf_short and hf_transfer and hf_xet stay", "my_hf_Short1 stays", "health_timeout_s: 1"]


@pytest.mark.parametrize("text, secret, kept", _GAPS)
def test_scrubber_gaps_are_closed_in_both_scrubbers(text, secret, kept):
    from ddtree_ops._core.scrub import scrub_text

    for out in (scrub(text), scrub_text(text)):
        assert secret not in out and REDACTED in out and kept in out, out


@pytest.mark.parametrize("text", _GAP_PROSE)
def test_prose_near_the_closed_gaps_stays_in_both_scrubbers(text):
    from ddtree_ops._core.scrub import scrub_text

    assert scrub(text) == text
    assert scrub_text(text) == text


@pytest.mark.parametrize("name, unit, count", [("glued hf_", "xhf_", 250_000), ("bearer runs", "bearer ", 140_000),
                                               ("header keys", "token: Bearer ", 70_000),
                                               ("glued short hf_", "ahf_Ab3", 140_000)])
def test_the_closed_gaps_keep_scrub_linear(name, unit, count):
    small = _cpu_seconds(unit * (count // 4))
    full = _cpu_seconds(unit * count)
    ratio = full / max(small, 0.005)
    assert ratio < 10, f"{name}: {full:.3f} s CPU for 4x the input of {small:.3f} s (x{ratio:.1f}): not linear"


@pytest.mark.parametrize("text, secret", [
    ("denied \x1b[31mBearer abcdefghijklmnop9", "abcdefghijklmnop9"),          # a coloured log line
    ("Authorization: \x1b[1mBearer SECRETsecret99", "SECRETsecret99"),
    ("x\x1b]0;title\x07hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345 y", "AbCdEfGhIjKlMnOpQrStUvWxYz012345"),
    ("\x9b1mtoken=ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123 end", "AbCdEfGhIjKlMnOpQrStUvWxYz0123"),
])
def test_a_terminal_escape_before_a_credential_does_not_hide_it(text, secret):
    """An escape sequence separates words (``\\x1b[31mBearer`` is not the word ``mBearer``); the
    escapes themselves are kept for the printer to strip."""
    got = scrub(text)
    assert secret not in got and REDACTED in got, repr(got)
    assert scrub("ok \x1b[0m plain \x1b[31mred\x1b[0m") == "ok \x1b[0m plain \x1b[31mred\x1b[0m"


# One scrubber: the standard-library core's (the preflight zipapp and the host readers use it too), so each
# case below runs through config.errors.scrub and _core.scrub.clean_text, and they must agree.
_STILL_GAPS = [
    # a list under a secret-looking name: every item goes, the list's shape stays
    ('{"client_secret": ["X9f2kQ7pLmN4"]}', ["X9f2kQ7pLmN4"], '{"client_secret": ["'),
    ('{"api_key": ["a", "b"]}', ['"a"', '"b"'], '{"api_key": ['),
    ("passwords = [hunter, swordfish]", ["hunter", "swordfish"], "passwords = ["),
    # an unencoded "@" in a URL password: the user info runs to the last "@" before the host
    ("https://user:p@ss@host/x", ["p@ss", "ss@"], "@host/x"),
    ("socks5://u:pa@ss:w@rd@proxy:1080 ok", ["pa@ss", "w@rd"], "@proxy:1080 ok"),
    # format characters or compatibility forms inside a token prefix
    ("h\u200bf_abcdefghijklmnopqrstuvwx end", ["abcdefghijklmnopqrstuvwx"], " end"),
    ("gh\u2060p_" + "a1" * 18 + " end", ["a1a1a1a1"], " end"),
    ("\uff48\uff46\uff3fabcdefghijklmnopqrstuvwx end", ["abcdefghijklmnopqrstuvwx"], " end"),  # fullwidth hf_
    ("\uff48\uff46\uff3f" + "".join(chr(0xff21 + i) for i in range(24)), ["\uff21\uff22\uff23"], ""),
    # issuers' shapes: npm (npm_ + 36 base62), Google API keys (AIza + 35), Slack incoming webhooks
    ("npm_" + "a1B2c3" * 6 + " end", ["a1B2c3a1B2c3"], " end"),
    ("NPM npm_" + "Z9" * 18, ["Z9Z9Z9Z9"], "NPM "),
    ("key AIzaSyDdVgKwhZl0sTTTLZ7iTmt1r3N2cJLnaDk set", ["SyDdVgKwhZl0sTTTLZ7i"], " set"),
    ("maps AIza" + "b-_9" * 8 + "abc end", ["b-_9b-_9"], " end"),
    ("post https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
     ["B00000000", "XXXXXXXX"], "https://hooks.slack.com/services/"),
    ("hook=https://hooks.slack.com/services/TABC12345/BDEF67890/aBcDeFgHiJkLmNoPqRsTuVwX ok",
     ["BDEF67890", "aBcDeFgH"], " ok"),
]


@pytest.mark.parametrize("text, secrets, kept", _STILL_GAPS)
def test_lists_url_passwords_folded_prefixes_and_issuer_shapes_are_redacted(text, secrets, kept):
    from ddtree_ops._core.scrub import clean_text

    for out in (scrub(text), clean_text(text)):
        assert REDACTED in out and kept in out, repr(out)
        for secret in secrets:
            assert secret not in out, repr(out)


def test_a_list_is_redacted_item_by_item_and_a_count_list_stays():
    assert scrub('{"api_key": ["a", "b"]}') == '{"api_key": ["(redacted)", "(redacted)"]}'
    assert scrub('"tokens": ["x1Y2z3", "abc"]') == '"tokens": ["x1Y2z3", "abc"]'  # "tokens" counts (no secret name)
    assert scrub("draft_tokens = [8, 16]") == "draft_tokens = [8, 16]"


def test_the_issuer_shapes_are_refused_as_values_and_stay_exact():
    """The shapes are the issuers' own lengths: shorter or longer runs after the prefix are not one."""
    from ddtree_ops.config.errors import looks_like_token

    assert looks_like_token("npm_" + "a1B2c3" * 6) == "an npm access token (npm_...)"
    assert looks_like_token("AIza" + "x" * 35) == "a Google API key (AIza...)"
    assert looks_like_token("https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXX") is not None
    for text in ("npm_install", "npm_" + "a" * 35, "AIza" + "x" * 34, "AIzations", "hooks.slack.com/services/"):
        assert looks_like_token(text) is None and scrub(text) == text, text


_READABLE = [
    "token_budget: 2048", "key_size=4096", "max_tokens=512", "max_new_tokens: 256",
    "use the --api-key flag", "--api-key is required", "set --admin-api-key when the port is public",
    "ssh://git@github.com/org/repo", "ftp://anonymous@mirror.example/pub",
    "primary key: id", "key: value", "the sort key: name",
]


@pytest.mark.parametrize("text", _READABLE)
def test_prose_that_was_mangled_stays_readable(text):
    from ddtree_ops._core.scrub import clean_text

    assert scrub(text) == text
    assert clean_text(text) == text


@pytest.mark.parametrize("text, secret", [
    ("DB_PASSWORD=2048", "2048"), ("api_key: 123456789", "123456789"),            # the name ends in a secret word
    ("--api-key sekritlower --port 1", "sekritlower"), ("--hf-token abcdefgh", "abcdefgh"),  # argv, not prose
    ("ssh://tok3nA1@host/x", "tok3nA1"), ("https://ghp_" + "a1" * 18 + "@github.com/x", "ghp_a1"),
    ("https://deploy:hunter2@host/x", "hunter2"),
])
def test_the_prose_rules_still_redact_secrets(text, secret):
    from ddtree_ops.config.errors import value_secret_reason

    assert secret not in scrub(text) and REDACTED in scrub(text)
    assert value_secret_reason(text) is not None


def test_a_plain_url_user_is_no_secret_value():
    from ddtree_ops.config.errors import value_secret_reason

    assert value_secret_reason("ssh://git@github.com/org/repo") is None
    assert value_secret_reason("https://user:p@ss@host/x") is not None


def test_an_escape_sequence_is_scrubbed_too():
    """An OSC 8 link or OSC 52 clipboard string holds text of its own: a password in it is redacted."""
    out = scrub("see \x1b]8;;https://u:SEKRITpw1@host/x\x07link\x1b]8;;\x07")
    assert "SEKRITpw1" not in out and out.startswith("see \x1b]8;;https://(redacted)@host/x")


# Hostile inputs of 1 MB, each against 1 MB of plain log text in the same run (CPU time, best of two): each
# pattern is linear (every match starts at the start of a run, and no match copies the rest of the text;
# 'Bearer ' * 200_000 cost 3.6 s before).
_PLAIN_1MB = ("INFO 12-04 loaded model in 3.2 s; draft tokens per request 8, key cache warm for b300-01 ok\n"
              * 11_000)[:1_000_000]


@pytest.mark.parametrize("unit", ["Bearer ", "token=", "a:", "://", "@", "hf_", "a-a://", "api_key: [",
                                  "h\u200bf_", "https://u:p@", "\uff41", "\uff48\uff46\uff3f\uff21\uff11 "])
def test_adversarial_1mb_costs_about_what_plain_text_costs(unit):
    hostile = unit * (1_000_000 // len(unit))
    plain = _cpu_seconds(_PLAIN_1MB)
    full = _cpu_seconds(hostile)
    quarter = _cpu_seconds(unit * (250_000 // len(unit)))
    ratio = full / max(plain, 0.005)
    assert ratio < 8, f"{unit!r}: {full:.3f} s CPU for 1 MB, plain text {plain:.3f} s (x{ratio:.1f})"
    growth = full / max(quarter, 0.005)
    assert growth < 10, f"{unit!r}: {full:.3f} s CPU for 4x the input of {quarter:.3f} s (x{growth:.1f}): not linear"
