"""Environment values (``secrets.env``, ``sglang.env``) refuse control, format and line/paragraph
separator characters (:mod:`ddtree_ops.config.envchars`): in the inventory with one line naming the
variable and the code point (never the secret), and again in the writer whatever made the value."""

from __future__ import annotations

import pytest
from helpers import base_hostvars

from ddtree_ops.config import ConfigError, validate_hostvars
from ddtree_ops.config.envchars import env_char_problem
from ddtree_ops.render import render_host
from ddtree_ops.render.files import env_value

SECRET = "sk-envCANARY0123456789"

REFUSED = {
    "line separator U+2028": "\u2028",
    "C1 CSI \\x9b": "\x9b",
    "paragraph separator U+2029": "\u2029",
    "C1 next line U+0085": "\x85",
    "right-to-left override U+202E": "\u202e",
    "zero width space U+200B": "\u200b",
    "byte order mark U+FEFF": "\ufeff",
    "lone surrogate": "\ud800",
    "newline": "\n",
    "escape": "\x1b",
    "DEL": "\x7f",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_secret_env_value_with_a_refused_character_is_one_line(name):
    c = REFUSED[name]
    hv = {**base_hostvars(), "ddtree_secret_env": {"API_KEY": SECRET[:6] + c + SECRET[6:]}}
    with pytest.raises(ConfigError) as info:
        validate_hostvars("b300-01", hv)
    (f,) = info.value.findings
    line = f.message()
    assert f.field == "ddtree_secret_env.API_KEY" or "API_KEY" in line, line
    assert f"U+{ord(c):04X}" in line and "\n" not in line
    assert "envCANARY" not in line and "envCANARY" not in repr(f.as_dict())


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_env_writer_refuses_them_whatever_made_the_value(name):
    with pytest.raises(ValueError, match=f"U\\+{ord(REFUSED[name]):04X}"):
        env_value("a" + REFUSED[name] + "b")


def test_letters_symbols_and_spaces_are_kept_and_quoted():
    hv = {**base_hostvars(), "ddtree_secret_env": {"API_KEY": "naïve key €"}}
    files = {f.path: f.content for f in render_host(validate_hostvars("b300-01", hv))}
    secrets = next(text for path, text in files.items() if path.endswith("secrets.env"))
    assert 'API_KEY="naïve key €"' in secrets.splitlines()
    assert all(env_char_problem(line) is None for line in secrets.splitlines())


def test_every_rendered_env_file_line_splits_the_same_for_every_reader():
    """systemd splits on \\n only; Python's splitlines also on U+2028, U+0085 ...: a valid inventory
    renders env files both read as the same lines."""
    for f in render_host(validate_hostvars("b300-01", {**base_hostvars(), "ddtree_secret_env": {"K": "v w"}})):
        if f.path.endswith(".env"):
            assert f.content.splitlines() == f.content.rstrip("\n").split("\n"), f.path
