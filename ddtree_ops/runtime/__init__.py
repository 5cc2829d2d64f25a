"""Operations against a running server over HTTP: health, warmup, the exporter, drift, bench
and its report."""
