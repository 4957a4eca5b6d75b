"""The policy search: an Optuna study in a SQLite file, resumable after Ctrl-C or SIGKILL.

* **Storage**: every finished trial is committed to the SQLite file as it ends.
  dtrlab writes only into a SQLite file that is new, empty or an Optuna storage
  whose studies dtrlab made; anything else is refused, unchanged.
* **One search at a time**: a search holds an exclusive lock (``STORAGE.lock``,
  released by the system when the process ends, however it ends); a second search
  on the same storage is refused with the first one's process id.
* **Same question**: a study records its traces (names and content hashes) and
  ratios; resuming it with other traces or ratios is refused (its trials would not
  be comparable), naming what differs.
* **Resume**: a trial left ``RUNNING`` by a killed process, or ``FAIL`` by an
  interrupted one, is marked failed and its parameters are enqueued once, so the
  next run evaluates exactly those parameters; its simulations that had finished are
  read back from the sweep cache, not simulated again. No completed trial is lost
  and none is evaluated twice.
* **Budget**: ``n_trials`` is the total number of finished (completed or pruned) trials the study should
  reach (a resumed search runs only the rest); ``timeout`` stops starting new trials
  after that many seconds.
* **Sampler**: TPE, seeded with ``seed + completed trials`` at each (re)start, so a
  resumed search is reproducible from the stored state. The first trial is h_DTR in
  float64 (:data:`~dtrlab.search.space.DTR_POINT`), the reference point.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from ..progress import progress_bar
from ..sweep.budget_sweep import parse_ratios
from ..sweep.execution import SERIAL, Execution
from .evaluate import SEARCH_RATIOS, evaluate, objective_value, summarize
from .space import DTR_POINT, SPACE, make_policy, suggest

PARETO_COLUMNS = ["trial", "policy", "holes", "threshold", "overhead", "value", *SPACE]


def _optuna():
    try:
        import optuna
    except ImportError:  # pragma: no cover - optuna is a core dependency
        raise ImportError("the policy search needs optuna: pip install optuna") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@dataclass(frozen=True)
class SearchResult:
    """What a search run did and the study's state at its end."""

    study_name: str
    storage: str
    completed: int
    ran: int
    retried: int
    seconds: float
    trials: pd.DataFrame
    pareto: pd.DataFrame


#: Tables every Optuna RDB storage has; a SQLite file without them is not one.
OPTUNA_TABLES = {"studies", "trials", "version_info"}
#: The study user attribute that marks a study dtrlab made (older dtrlab studies have "tuning_traces").
MADE_BY = "made_by"


def _rdb(path: str | os.PathLike):
    return _optuna().storages.RDBStorage(f"sqlite:///{Path(path).resolve()}")


def check_storage(path: str | os.PathLike) -> None:
    """Refuse, before anything is written, a file that is not a new, empty or dtrlab-made Optuna storage."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb") as handle:
        if handle.read(16) != b"SQLite format 3\x00":
            raise ValueError(f"{path} is not a SQLite file; give a new --storage (or the file of an earlier search)")
    try:
        uri = f"file:{quote(str(path.resolve()))}?mode=ro"  # read-only: nothing is written while checking
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=30)) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                return
            missing = OPTUNA_TABLES - tables
            if missing:
                raise ValueError(f"{path} is a SQLite database of something else (tables: "
                                 f"{', '.join(sorted(tables))}); dtrlab leaves it alone: give a new --storage")
            foreign = [name for (name,) in db.execute(
                "SELECT study_name FROM studies s WHERE NOT EXISTS (SELECT 1 FROM study_user_attributes a "
                "WHERE a.study_id = s.study_id AND a.key IN (?, 'tuning_traces'))", (MADE_BY,))]
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{path}: damaged SQLite file ({exc}); give a new --storage") from None
    if foreign:
        raise ValueError(f"{path} holds Optuna studies dtrlab did not make ({', '.join(foreign)}); dtrlab leaves it "
                         "alone: give a new --storage")


@contextlib.contextmanager
def storage_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold the exclusive lock of the storage ``path`` (``PATH.lock`` beside it) for one search."""
    lock_path = Path(f"{path}.lock")
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise ValueError(f"{path} is in use by PID {holder} (another dtrlab search); wait for it to end, "
                             "or give another --storage") from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        yield  # the lock goes with the file's closing, or with the process


def open_study(storage: str | os.PathLike, study_name: str = "score_search", seed: int = 0):
    """Create or load the study in the SQLite file ``storage`` (see :func:`check_storage`)."""
    optuna = _optuna()
    import sqlalchemy.exc

    check_storage(storage)
    try:
        study = optuna.create_study(study_name=study_name, storage=_rdb(storage), load_if_exists=True,
                                    direction="minimize")
        if not study.trials and MADE_BY not in study.user_attrs:  # a new study (an old one is only read)
            study.set_user_attr(MADE_BY, "dtrlab")
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise ValueError(f"{storage}: the Optuna storage cannot be used ({_first_line(exc)})") from None
    completed = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    study.sampler = optuna.samplers.TPESampler(seed=seed + completed, n_startup_trials=8)
    return study


def _recover(study, path) -> int:
    """Mark trials a dead process left RUNNING as failed; enqueue failed trials' parameters once."""
    optuna = _optuna()
    state = optuna.trial.TrialState
    # The storage lock makes one search at a time: a RUNNING trial at start-up belongs to a process that died.
    storage = _rdb(path)
    study_id = storage.get_study_id_from_name(study.study_name)
    trials = study.get_trials(deepcopy=False)
    for trial in trials:
        if trial.state == state.RUNNING:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            storage.set_trial_state_values(trial_id, state=state.FAIL)
    trials = study.get_trials(deepcopy=False)
    planned = {json.dumps(t.params, sort_keys=True) for t in trials if t.state in (state.COMPLETE, state.WAITING)}
    planned |= {json.dumps(t.system_attrs.get("fixed_params", {}), sort_keys=True)
                for t in trials if t.state == state.WAITING}
    retried = 0
    for trial in trials:
        key = json.dumps(trial.params, sort_keys=True)
        if trial.state == state.FAIL and trial.params and key not in planned:
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
            planned.add(key)
            retried += 1
    return retried


def run_search(traces, storage: str | os.PathLike, *, study_name: str = "score_search", n_trials: int | None = 20,
               timeout: float | None = None, ratios=SEARCH_RATIOS, seed: int = 0, prune_margin: int | None = 2,
               execution: Execution = SERIAL) -> SearchResult:
    """Search the :data:`~dtrlab.search.space.SPACE` on ``traces`` until the study has
    ``n_trials`` finished (completed or pruned) trials or ``timeout`` seconds passed (at least one must be given).

    Each trial sweeps one policy over every trace at ``ratios`` (where ``execution`` says; its
    ``progress`` is the search's bar, not each sweep's) and is ranked by
    :func:`~dtrlab.search.evaluate.objective_value`.
    Traces are evaluated shortest schedule first; with ``prune_margin`` a trial stops
    (state PRUNED, counted as finished) once its holes so far exceed the best
    completed trial's total by more than the margin: it cannot be best and its
    remaining traces would cost the most. ``None`` evaluates every trial fully.
    """
    if n_trials is None and timeout is None:
        raise ValueError("give a budget: n_trials= (total finished trials) or timeout= (seconds), or both")
    if n_trials is not None and n_trials < 1:
        raise ValueError(f"n_trials is the number of finished trials to reach (>= 1), got {n_trials}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout is seconds (> 0), got {timeout}")
    traces = list(traces.values()) if isinstance(traces, dict) else list(traces)
    parse_ratios(ratios)  # checked before the storage is touched
    import sqlalchemy.exc

    with storage_lock(storage):
        try:
            return _search(traces, storage, study_name, n_trials, timeout, ratios, seed, prune_margin, execution)
        except sqlalchemy.exc.SQLAlchemyError as exc:  # a storage damaged where opening it did not look
            raise ValueError(f"{storage}: the Optuna storage failed ({_first_line(exc)}); give a new --storage") \
                from None


def _first_line(exc) -> str:
    """An SQLAlchemy error's cause on one line (its message runs to many lines of SQL)."""
    return " ".join(str(getattr(exc, "orig", None) or exc).split())


def _check_same_question(study, storage, traces, ratios) -> None:
    """Record the study's traces and ratios, or refuse those that differ from what it recorded."""
    names = sorted(t.name for t in traces)
    hashes = {t.name: t.content_hash for t in traces}
    ratio_list = ratios if isinstance(ratios, str) else list(ratios)
    stored = study.user_attrs if study.trials else {}  # a study without trials asks nothing yet
    where = f"{storage} (study {study.study_name!r})"
    if "tuning_traces" in stored and stored["tuning_traces"] != names:
        raise ValueError(f"{where} was searched on traces {', '.join(stored['tuning_traces'])}, not "
                         f"{', '.join(names)}; its trials are not comparable: give another --storage or --study")
    changed = [n for n, h in stored.get("trace_hashes", {}).items() if hashes.get(n) != h]
    if changed:
        raise ValueError(f"{where} was searched on other contents of {', '.join(changed)} (the logs changed); "
                         "give another --storage or --study")
    if "ratios" in stored and parse_ratios(stored["ratios"]) != parse_ratios(ratio_list):
        raise ValueError(f"{where} was searched at ratios {stored['ratios']}, not {ratio_list}; its trials are "
                         "not comparable: give the same --ratios, or another --storage or --study")
    for key, value in (("tuning_traces", names), ("trace_hashes", hashes), ("ratios", ratio_list)):
        if key not in stored:  # a new study, or one made before dtrlab recorded this
            study.set_user_attr(key, value)


def _search(traces, storage, study_name, n_trials, timeout, ratios, seed, prune_margin,
            execution: Execution) -> SearchResult:
    optuna = _optuna()
    study = open_study(storage, study_name, seed)
    _check_same_question(study, storage, traces, ratios)
    retried = _recover(study, storage)
    complete = optuna.trial.TrialState.COMPLETE
    finished_states = (complete, optuna.trial.TrialState.PRUNED)
    traces = sorted(traces, key=lambda t: (len(t.schedule), t.name))
    if not study.trials:
        study.enqueue_trial(DTR_POINT, user_attrs={"reference": "dtr_float64"})

    def objective(trial):
        policy = make_policy(suggest(trial))
        finished = [t for t in study.get_trials(deepcopy=False, states=(complete,))]
        best_holes = min((t.user_attrs["holes"] for t in finished), default=None)
        tables = []
        for trace in traces:  # cheapest first, so that a hopeless trial stops early
            tables.append(evaluate(policy, [trace], ratios=ratios, execution=execution.with_(progress=False)).table)
            holes = int(sum(table["holes"].sum() for table in tables))
            if prune_margin is not None and best_holes is not None and holes > best_holes + prune_margin:
                trial.set_user_attr("holes_when_pruned", holes)
                trial.set_user_attr("traces_when_pruned", len(tables))
                raise optuna.TrialPruned()
        table = pd.concat(tables, ignore_index=True)
        result = summarize(table)
        for key, value in result.as_dict().items():
            trial.set_user_attr(key, value)
        trial.set_user_attr("per_trace", table[["trace", "holes", "threshold_ratio", "mean_pass_overhead"]]
                            .astype(object).where(table.notna(), None).to_dict("records"))
        return objective_value(result.holes, result.threshold, result.overhead)

    def completed() -> int:
        return sum(t.state in finished_states for t in study.get_trials(deepcopy=False))

    started = time.monotonic()
    done_before = completed()
    target = n_trials if n_trials is not None else None
    bar = progress_bar(total=target, initial=min(done_before, target or done_before), desc=f"search {study_name}",
               unit="trial", disable=not execution.progress)
    try:
        while (target is None or completed() < target) and (timeout is None or time.monotonic() - started < timeout):
            study.optimize(objective, n_trials=1, catch=())
            bar.update()
            best = study.best_trial
            bar.set_postfix(holes=best.user_attrs.get("holes"), threshold=f"{best.user_attrs.get('threshold'):.4f}")
    finally:
        bar.close()
    done = completed()
    return SearchResult(study_name=study_name, storage=str(storage), completed=done, ran=done - done_before,
                        retried=retried, seconds=time.monotonic() - started, trials=trials_table(study),
                        pareto=pareto_table(study))


def trials_table(study) -> pd.DataFrame:
    """Every completed trial: its metrics, objective value and parameters, best first."""
    optuna = _optuna()
    rows = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        attrs = trial.user_attrs
        rows.append({"trial": trial.number, "policy": make_policy(trial.params).label, "holes": attrs["holes"],
                     "threshold": attrs["threshold"], "overhead": attrs["overhead"], "value": trial.value,
                     **trial.params})
    frame = pd.DataFrame(rows, columns=PARETO_COLUMNS)
    return frame.sort_values(["value", "trial"], kind="stable").reset_index(drop=True)


def pareto_table(study) -> pd.DataFrame:
    """The completed trials no other trial beats in all of holes, threshold and overhead."""
    trials = trials_table(study)
    metrics = trials[["holes", "threshold", "overhead"]].to_numpy(dtype=float)
    keep = []
    for i, row in enumerate(metrics):
        dominated = ((metrics <= row).all(axis=1) & (metrics < row).any(axis=1)).any()
        keep.append(not dominated)
    pareto = trials[keep]
    # Trials with identical metrics (different parameters, same decisions) show once.
    return pareto.drop_duplicates(["holes", "threshold", "overhead"]).reset_index(drop=True)
