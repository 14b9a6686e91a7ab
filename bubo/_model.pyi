"""The native model and its paged KV cache (bubo/_model.pyx)."""
from typing import Any

import numpy as np
import numpy.typing as npt

REQUANT_TYPES: tuple[str, ...]
MAX_LORA: int  # adapter slots of a model (bubo/lora.py)
LORA_MATS: tuple[str, ...]  # the matrices an adapter pairs with, by their GGUF names

class Model:
    """A GGUF model (decoders: llama, qwen2, qwen3, gemma3; encoder: bert) on the native forward pass.

    Raises GGUFError naming the file and the tensor or key for a malformed model, UnsupportedError
    for an unknown architecture or a block type without kernels."""

    path: str
    hparams: dict[str, Any]
    def __init__(self, path: str | bytes, n_threads: int = 0, requant: str | None = None,
                 n_threads_batch: int = 0) -> None:
        """requant: the layers' matrices (and an untied output) whose rows are wider in their own
        type are rewritten in this one at load (one of REQUANT_TYPES; None: as in the file): for
        a draft model, whose weights only guess what the target checks."""
    @property
    def active_threads(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    def share_pool(self, other: Model) -> None:
        """Run on other's thread pool from now on (this model's own is let go): for a draft model
        and its target, which never decode at the same time. Both must have the same thread
        count (ValueError otherwise); other is kept alive as long as this model."""
    @property
    def out_vocab(self) -> int:
        """Logits come for tokens 0 .. out_vocab - 1 (n_vocab unless set lower)."""
    @out_vocab.setter
    def out_vocab(self, n: int) -> None:
        """Logits for the first n tokens only (rounded up to a multiple of 16; 0 or >= n_vocab:
        every token): a draft model's output product then reads only their rows."""
    @property
    def output_hidden(self) -> bool:
        """True while decode returns normed hidden states [n_out, n_embd] instead of logits."""
    @output_hidden.setter
    def output_hidden(self, on: bool) -> None: ...
    def encode(self, tokens: npt.ArrayLike, seq_lens: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """An encoder's last hidden states: tokens (int32) holds the sequences end to end, seq_lens
        their lengths. Returns float32 [len(tokens), n_embd]. ValueError for a decoder, an empty or
        too long sequence, a token id out of range."""
    def lora_set(self, slot: int, layer: int, mat: int, a: npt.ArrayLike, b: npt.ArrayLike, factor: float) -> None:
        """Adapter slot's pair for a layer's matrix (LORA_MATS' index): a [r, cols], b [rows, r]."""
    def lora_clear(self, slot: int) -> None: ...
    def matrix_shape(self, layer: int, mat: int) -> tuple[int, int]: ...
    def decode(
        self,
        kv: KVCache,
        tokens: npt.ArrayLike,
        pos: npt.ArrayLike,
        seq_ids: npt.ArrayLike,
        logits_rows: npt.ArrayLike,
        lora_scales: npt.ArrayLike | None = None,
    ) -> npt.NDArray[np.float32]:
        """Run a batch; returns float32 [n_out, out_vocab] for the rows where logits_rows is true.
        lora_scales: float32 [rows, MAX_LORA], each row's scale of each adapter slot.

        Each sequence's tokens must continue it (first at pos == kv.seq_len(seq)). ValueError for
        a token id out of range, a position gap, a full context; the cache is then unchanged."""

class KVCache:
    """Paged KV cache of one model: at most n_ctx tokens per sequence, blocks of block_size
    tokens shared by n_seq_max sequences, K rows stored as type and V rows as type_v (the same
    when None): "f16", "f32", "q8_0" or "q4_0". Memory is taken as
    blocks are first needed (n_ctx may exceed memory); Model.decode raises MemoryError, the
    cache unchanged, when the OS refuses more. Full blocks can be shared across requests through
    the prefix cache (prefix_register, prefix_attach), except with swa_full=False."""

    model: Model
    def __init__(
        self,
        model: Model,
        n_ctx: int,
        n_seq_max: int = 1,
        block_size: int = 32,
        type: str = "f16",
        n_batch: int = 512,
        swa_full: bool = True,
        type_v: str | None = None,
    ) -> None:
        """swa_full=False: sliding-window layers keep only their window (plus n_batch tokens) per
        sequence, and truncate refuses (ValueError) to go below a position they released.
        n_batch (1..512): the most rows model.decode then runs at once. swa_full=True keeps every
        block of every layer (the window is only a mask), so any truncation works."""
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_seq_max(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def type(self) -> str:
        """K rows' storage type."""
    @property
    def type_v(self) -> str:
        """V rows' storage type."""
    @property
    def n_free_tokens(self) -> int: ...
    @property
    def nbytes(self) -> int:
        """Bytes of K and V storage at full capacity: the global pool plus the sliding-window
        pool, which holds each sequence's window (plus one decode chunk) only. The global pool
        is reserved, not taken: see committed_bytes."""
    @property
    def committed_bytes(self) -> int:
        """Bytes taken from the OS so far: the global pool grows in chunks as blocks are first
        needed (kept once taken); the sliding-window pool is taken whole."""
    @property
    def token_bytes(self) -> int:
        """K and V bytes one token takes in the global pool."""
    def grow_bytes(self, seq: int, n_tokens: int) -> int:
        """Bytes the cache would still take from the OS for seq to hold n_tokens (capped at n_ctx)."""
    def reserve(self, n_tokens: int) -> None:
        """Commit the global pool ahead of use up to n_tokens (capped at n_ctx): freed prefix blocks
        then stay cached until that much is in use. MemoryError when the OS refuses."""
    def committed_blocks(self, swa: bool = False) -> int: ...
    @property
    def sliding_window(self) -> int: ...
    @property
    def swa_full(self) -> bool: ...
    def pool_blocks(self, swa: bool = False) -> int: ...
    def blocks_in_use(self, swa: bool = False) -> int: ...
    def seq_blocks(self, seq: int, swa: bool = False) -> int: ...
    def seq_len(self, seq: int) -> int: ...
    def truncate(self, seq: int, n: int) -> None:
        """Keep the first n tokens; ValueError when the sliding-window layers already dropped a
        position the next token would attend to (n = 0 always works)."""
    def fork(self, src: int, dst: int) -> None: ...
    def seq_shared_blocks(self, seq: int) -> int:
        """seq's blocks that another sequence holds too (shared by a fork, copied when written)."""
    def seq_last_shared(self, seq: int) -> bool:
        """Whether seq's last block is partly filled and shared (its next append copies it)."""
    def seq_bytes(self, n: int) -> int:
        """Bytes export_rows gives for n tokens (whole blocks of every layer's K and V)."""
    def export_rows(self, seq: int, n: int) -> bytes:
        """The K and V rows of seq's first n tokens (slot files). ValueError for a cache with
        sliding-window layers."""
    def import_rows(self, seq: int, n: int, data: bytes) -> None:
        """Fill the empty sequence seq with n tokens' rows from export_rows' bytes. ValueError for
        the wrong size or a sequence not empty, MemoryError without room; nothing changes then."""
    def free(self, seq: int) -> None: ...
    def prefix_attach(self, seq: int, tokens: npt.ArrayLike) -> int:
        """Start the empty sequence seq with the longest run of cached full blocks that begins
        tokens (within len(tokens)); returns its length, a multiple of block_size. ValueError
        when seq is not empty; 0 for a cache with a sliding-window pool (swa_full=False)."""
    def prefix_namespace(self, seq: int, ns: int) -> None:
        """The namespace of the empty sequence seq (0 by default): it attaches and registers only
        blocks of its namespace."""
    def prefix_register(self, seq: int, tokens: npt.ArrayLike) -> None:
        """Index the full blocks of seq's tokens[0:len(tokens)] (rows written) for later
        prompts; cheap to call after every step with the same growing tokens."""
    def prefix_clear(self) -> None: ...
    @property
    def n_cached_blocks(self) -> int:
        """Indexed blocks no sequence holds (they count as free in n_free_tokens)."""
    @property
    def n_indexed_blocks(self) -> int: ...
    @property
    def prefix_enabled(self) -> bool: ...
    def prefix_stats(self) -> dict[str, int]:
        """{"lookups", "hit_blocks", "evicted"} since the cache was made."""
    def _prefix_hash_mask(self, mask: int) -> None: ...
    def _check(self) -> None: ...
