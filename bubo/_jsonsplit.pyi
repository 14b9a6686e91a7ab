"""Where a large JSON text may be cut (csrc/include/bubo/jsonsplit.h), found without the GIL."""

OPEN: int
RUN: int
CLOSE: int
UNTERMINATED_STRING: int
UNMATCHED: int
UNCLOSED: int
TOO_DEEP: int

def split(text: bytes, large: int, run: int, max_depth: int) -> tuple[list[tuple[int, int, int]], int, int]: ...
