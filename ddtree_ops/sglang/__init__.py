"""Talking to a running SGLang server over HTTP."""
