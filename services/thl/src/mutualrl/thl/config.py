"""THL configuration: the `thl:` section of a run YAML."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from mutualrl.common.config import ServiceConfig, TokenizerId


class ThlConfig(ServiceConfig):
    """The Tokenizer Heterogeneity Layer service (`mutualrl thl serve --config run.yaml`)."""

    port: int = Field(default=50052, ge=0, le=65535)
    """gRPC port (0 picks a free one)."""
    metrics_port: int | None = Field(default=9102, ge=0, le=65535)
    """Prometheus /metrics port; None serves none (0 picks a free one)."""
    redis_url: str | None = None
    """Redis that persists tokenizer registrations (shared by replicas), in the hash
    `<key_prefix>:thl:tokenizers` (a Redis Cluster as redis+cluster://host:port[,...]). None:
    use `state_dir` if set, else keep registrations in memory only."""
    state_dir: Path | None = None
    """Directory for `tokenizers.json` when there is no Redis (single-replica deployments)."""
    cache_size: int = Field(default=16, ge=1)
    """Loaded tokenizers kept in memory (LRU); others are reloaded from their paths on use."""
    cache_max_bytes: int = Field(default=256 << 20, ge=1)
    """Loaded tokenizers kept in memory, in bytes of their serialized tokenizer.json (LRU, with
    `cache_size`; the most recently used one is always kept). A loaded tokenizer takes a small
    multiple of that size in memory (2-4x for BPE vocabularies and merges)."""
    max_tokenizer_bytes: int = Field(default=64 << 20, ge=1)
    """Largest tokenizer RegisterTokenizer accepts, in bytes of its tokenizer.json (measured
    before loading; a directory converted on load is measured after): larger is
    INVALID_ARGUMENT naming `path`. Real vocabularies are a few MB (250k-token ones ~20 MB)."""
    max_tokenizers: int = Field(default=1024, ge=1)
    """Most tokenizer registrations held; registering a new id beyond it is RESOURCE_EXHAUSTED
    naming `tokenizer_id` (DeleteRun releases a run's). Bounds the registry and the
    ListTokenizers answer."""
    max_runs_per_tokenizer: int = Field(default=256, ge=1)
    """Most runs holding one registration (its record lists them); one more is
    RESOURCE_EXHAUSTED naming `run_id`."""
    max_batch: int = Field(default=1024, ge=1)
    """Most texts (Retokenize) or items (AlignTrace) per call."""
    max_text_bytes: int = Field(default=1 << 20, ge=1)
    """Largest text per entry, in UTF-8 bytes."""
    max_request_text_bytes: int = Field(default=4 << 20, ge=1)
    """Most UTF-8 bytes of text in one Retokenize or AlignTrace call, all entries together
    (over it: INVALID_ARGUMENT naming `texts` / `items`). A call's working memory grows with
    its text: up to ~100 bytes per text byte while it is tokenized and answered."""
    max_inflight_request_bytes: int = Field(default=96 << 20, ge=1024)
    """Request bytes THL's calls hold at once: a call takes its method's largest request
    before its body is read (AlignTrace: `max_message_bytes`), then the body's length, held
    until its answer is sent; one that does not fit waits up to `request_wait_seconds`, then
    is RESOURCE_EXHAUSTED (retry later). One call alone always runs. With
    `max_request_text_bytes` and `max_working_bytes` it bounds THL's memory whatever clients
    send."""
    work_threads: int = Field(default=2, ge=1)
    """Retokenize / AlignTrace calls worked on at once (others wait their turn, their request
    bytes counted in `max_inflight_request_bytes`)."""
    max_working_bytes: int = Field(default=256 << 20, ge=1 << 20)
    """Working memory the Retokenize / AlignTrace calls being worked on may take together. A
    call needs ~400 bytes per UTF-8 byte of the largest block it encodes at once (256 KiB of
    texts, or one larger text: its Encoding in the tokenizer, its arrays and its answer); one
    that does not fit beside the calls running waits its turn, and a call alone always runs.
    With the defaults a 1 MiB text runs alone, and texts of a few kB run many at once.
    THL's peak is about its memory after start-up and registrations (with its tokenizer cache)
    plus this plus the request bytes held (`max_inflight_request_bytes`; docs/reliability.md
    has the measure)."""
    align_block_items: int = Field(default=64, ge=1)
    """Items aligned per vectorised pass (larger blocks fall out of CPU cache)."""
    tokenizer_roots: list[Path] = Field(default_factory=lambda: [Path("runs"), Path("/data/run")])
    """Directories RegisterTokenizer may read from: a path a client sends must lie under one of
    them, also after following symlinks, or the call is INVALID_ARGUMENT (the same answer
    whether or not anything exists there), and so must every file a load opens, resolved (a
    file or directory linked out of the roots, a FIFO or device: refused). Relative entries
    resolve against THL's working directory. The default covers `runs/` (the trainer's default
    `output_dir`) and `/data/run` (the run volume of the Compose and Kubernetes deployments);
    `mutualrl up` adds the run's `output_dir` and every policy's `model_path` and
    `sft_checkpoint`, with the directories their files link into (a Hugging Face cache
    snapshot links into the cache's `blobs/`). An empty list refuses every registration over
    gRPC (start-up `tokenizers` still load)."""
    tokenizers: dict[TokenizerId, str] = Field(default_factory=dict)
    """Tokenizers to register at start-up: id -> local path (directory or tokenizer.json);
    an id already registered with another path is overwritten."""

