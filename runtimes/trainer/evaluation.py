"""Evaluation after training: the candidate adapter and the current champion, scored alike.

`training.py` calls `evaluate` on rank 0 once training ended, before the adapter is saved.
Both adapters are scored by `score` on the same held-out rows (what `data.split` held out of
the dataset with the run's seed, or `eval_dataset`), in the same order and batches, so two
runs of a rule on the same data and seed compare like with like:

    eval_loss        the mean cross-entropy per trained token (the tokens the training loss
                     counts: completions, assistant turns, or all of a `text` record)
    perplexity       exp(eval_loss)
    token_accuracy   the share of trained tokens whose most likely next token is the label

The champion (`champion_uri`, which the orchestrator passes for a rule with `promote:`) is
an adapter directory, or a published folder (`<output_uri>/<job>/`, its manifest required
on object storage, the adapter under `adapter/`). It is loaded beside the candidate as a
second adapter of the same PeftModel (no second copy of the base model), scored, and deleted
again, so the adapter saved afterwards is the candidate's alone. A champion that cannot be
fetched or loaded gives `champion_error` (why) instead of scores; the orchestrator's gate
then keeps the champion (`orchestrator/jobs/promotion.py`).

The result lands in `result.json`'s metrics as `eval_loss`, `perplexity`, `token_accuracy`
and `champion_eval_loss`, `champion_perplexity`, `champion_token_accuracy` (or
`champion_error`), and from there in the completion event and Kubeflow's `trainerStatus`.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimes import storage
from runtimes.trainer.data import IGNORE_INDEX, TokenizedExample
from runtimes.trainer.progress import Reporter

CHAMPION_ADAPTER = "champion"
"""The name the champion is loaded under, beside the candidate's `default`."""
ADAPTER_CONFIG = "adapter_config.json"
CHAMPION_ERROR = "champion_error"
MAX_ERROR_TEXT = 200
"""Longest `champion_error` kept: the reason, not a traceback."""


class ChampionUnavailableError(Exception):
    """The champion adapter cannot be fetched or loaded; the message says why."""


@dataclass(frozen=True, slots=True)
class Scores:
    """One adapter's scores on the held-out rows."""

    eval_loss: float
    perplexity: float
    token_accuracy: float
    tokens: int
    """Trained tokens scored."""

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        metrics = {
            f"{prefix}eval_loss": self.eval_loss,
            f"{prefix}perplexity": self.perplexity,
            f"{prefix}token_accuracy": self.token_accuracy,
        }
        # exp() of a huge loss is infinite: no JSON number, and no use to compare.
        return {name: value for name, value in metrics.items() if math.isfinite(value)}


def score(model: Any, rows: Sequence[TokenizedExample], *, batch_size: int, pad_id: int) -> Scores:
    """The scores of *model*'s active adapter on *rows* (which must not be empty).

    Sums each trained token's negative log-likelihood in float64 over every batch and divides
    once at the end: the mean per token, whatever the batch size.
    """
    import torch

    from runtimes.trainer.batching import make_collator, to_dataset

    collate = make_collator(pad_id)
    items = to_dataset(rows)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = 0.0
    correct = 0
    tokens = 0
    try:
        with torch.no_grad():
            for start in range(0, len(items), batch_size):
                end = min(start + batch_size, len(items))
                batch = collate([items[index] for index in range(start, end)])
                labels = batch.pop("labels").to(device)
                inputs = {name: tensor.to(device) for name, tensor in batch.items()}
                logits = model(**inputs).logits[:, :-1].float()
                targets = labels[:, 1:]
                trained = targets != IGNORE_INDEX
                chosen, expected = logits[trained], targets[trained]
                total += float(
                    torch.nn.functional.cross_entropy(chosen, expected, reduction="sum").double()
                )
                correct += int((chosen.argmax(dim=-1) == expected).sum())
                tokens += int(trained.sum())
    finally:
        model.train(was_training)
    if not tokens:
        raise ValueError("no trained token among the rows to score")
    mean = total / tokens
    return Scores(
        eval_loss=mean,
        perplexity=math.exp(mean) if mean < 700 else math.inf,
        token_accuracy=correct / tokens,
        tokens=tokens,
    )


def champion_adapter_dir(uri: str, settings: storage.StorageSettings, *, fetch_into: Path) -> Path:
    """A local directory holding the champion adapter at *uri*.

    A local path is used where it is; anything else must be a published folder whose
    manifest and files are all there (`storage.adapter_exists`), copied into *fetch_into*.
    Either may be the adapter directory itself or a folder with it under `adapter/`.

    Raises:
        ChampionUnavailableError: nothing usable there, or the store failed.
    """
    try:
        location = storage.parse_location(uri)
        if location.scheme is storage.Scheme.FILE:
            folder = Path(location.path)
        else:
            if not storage.adapter_exists(uri, settings):
                raise ChampionUnavailableError(
                    f"no complete published adapter at {uri} (no manifest, or a file missing)"
                )
            shutil.rmtree(fetch_into, ignore_errors=True)  # a retried pod's partial copy
            folder = storage.fetch_model(uri, settings, into=fetch_into)
    except storage.StorageError as exc:
        raise ChampionUnavailableError(exc.message) from exc
    for candidate in (folder, folder / "adapter"):
        if (candidate / ADAPTER_CONFIG).is_file():
            return candidate
    raise ChampionUnavailableError(
        f"no adapter at {uri}: neither {ADAPTER_CONFIG} nor adapter/{ADAPTER_CONFIG}"
    )


def evaluate(
    model: Any,
    rows: Sequence[TokenizedExample],
    *,
    batch_size: int,
    pad_id: int,
    champion_uri: str | None,
    settings: storage.StorageSettings,
    fetch_into: Path,
    reporter: Reporter,
) -> dict[str, Any]:
    """Score the candidate (the PeftModel's active adapter) and, with *champion_uri*, the
    champion on *rows*; the metrics for `result.json` (see the module docstring).

    With no held-out rows there is nothing to score: the `evaluated` event says so and no
    metric is returned, so a gate declines the adapter rather than promote it unmeasured.
    """
    if not rows:
        reason = (
            "no held-out example to evaluate on: the dataset is too small to hold one out "
            "(at least 2 examples are needed), eval_fraction is 0, or no held-out example "
            "has a trained token within max_seq_length"
        )
        reporter.emit("evaluated", skipped=reason)
        return {}
    candidate = score(model, rows, batch_size=batch_size, pad_id=pad_id)
    metrics: dict[str, Any] = candidate.as_metrics()
    champion: Scores | None = None
    error: str | None = None
    if champion_uri is not None:
        try:
            champion = _score_champion(
                model,
                rows,
                champion_uri,
                batch_size=batch_size,
                pad_id=pad_id,
                settings=settings,
                fetch_into=fetch_into,
            )
        except ChampionUnavailableError as exc:
            error = str(exc)[:MAX_ERROR_TEXT]
    if champion is not None:
        metrics.update(champion.as_metrics("champion_"))
    if error is not None:
        metrics[CHAMPION_ERROR] = error
    reporter.emit(
        "evaluated",
        examples=len(rows),
        tokens=candidate.tokens,
        candidate=candidate.as_metrics(),
        champion=champion.as_metrics() if champion is not None else None,
        champion_uri=champion_uri,
        champion_error=error,
    )
    return metrics


def _score_champion(
    model: Any,
    rows: Sequence[TokenizedExample],
    uri: str,
    *,
    batch_size: int,
    pad_id: int,
    settings: storage.StorageSettings,
    fetch_into: Path,
) -> Scores:
    directory = champion_adapter_dir(uri, settings, fetch_into=fetch_into)
    candidate = model.active_adapter
    try:
        model.load_adapter(str(directory), adapter_name=CHAMPION_ADAPTER, is_trainable=False)
    except Exception as exc:  # peft raises what it meets: OSError, ValueError, RuntimeError...
        raise ChampionUnavailableError(
            f"the champion at {uri} does not load onto this base model: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    try:
        model.set_adapter(CHAMPION_ADAPTER)
        return score(model, rows, batch_size=batch_size, pad_id=pad_id)
    finally:
        model.set_adapter(candidate)
        model.delete_adapter(CHAMPION_ADAPTER)
