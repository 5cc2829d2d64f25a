"""Renderers: SGLang argv and the files installed on hosts."""

from .argv import build_argv
from .files import RenderedFile, render_host, render_prometheus, systemd_exec, systemd_quote

__all__ = ["RenderedFile", "build_argv", "render_host", "render_prometheus", "systemd_exec", "systemd_quote"]
