"""Operations against a running server: health, warmup."""
