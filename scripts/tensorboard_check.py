"""Check in a real headless browser that TensorBoard shows the runs' HParams table and Custom Scalars charts.

    python scripts/tensorboard_check.py --logdir DIR --runs N --metrics TAG [TAG ...] --out FOLDER \
        [--name PREFIX] [--charts TITLE ...] [--timeout S] [--load-fast auto|true|false]

It starts TensorBoard (from this interpreter) on ``DIR`` and opens it in headless Chromium (driven by Selenium
through the system's ``/usr/bin/chromedriver``; the network is never needed), then:

1. **HParams** (the ``#hparams`` dashboard, its TABLE VIEW: a ``vaadin-grid`` in ``tf-hparams-table-view``;
   TensorBoard 2.21's Time Series runs table does not show hparams): at least ``N`` rows (one per run: a run's
   session group), and each ``--metrics`` tag a column with a finite number in every row. That dashboard shows
   only the first 5 metrics (and 5 hparams) as columns; the check ticks the metric's box in the left pane when
   it is not shown. Saves ``FOLDER/PREFIX_hparams.png``.
2. **Custom Scalars** (``#custom_scalars``): opens every collapsed category and lifts the 12-charts-a-page
   limit, then every chart title of the layout (merged, as TensorBoard does, over the runs' event files, or
   given with ``--charts``) must be a card whose chart drew at least one line or point (an SVG
   ``path.line`` with a segment, or a ``path.symbol``, in its ``vz-line-chart2``). Saves
   ``FOLDER/PREFIX_custom_scalars.png`` (the window is made tall enough to show every chart).

It prints a JSON summary on stdout and exits 0; 1 when a check fails (the message on stderr names what is
missing; the summary is still printed and both screenshots still saved); 2 when the check cannot run
(TensorBoard does not start, no Chromium...). :func:`check` does the same for a test: it returns the summary
or raises :class:`CheckFailed` (an ``AssertionError``, with ``.summary``).

Needs: ``apt-get install -y chromium chromium-driver`` and ``pip install selenium``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1600,1000"]
WINDOW = (1600, 1000)
MAX_WINDOW = (3840, 8000)
"""The largest window a screenshot may grow to (a wide HParams table, a tall Custom Scalars page)."""

# JavaScript run in the page. ``deepAll`` is querySelectorAll that also searches every shadow root below.
JS_DEEP = """
function deepAll(root, sel, acc) {
  acc = acc || [];
  root.querySelectorAll(sel).forEach(e => acc.push(e));
  root.querySelectorAll('*').forEach(e => { if (e.shadowRoot) deepAll(e.shadowRoot, sel, acc); });
  return acc;
}
function text(e) { return e ? (e.innerText || e.textContent || '').trim() : ''; }
"""
JS_HPARAMS_TABLE = JS_DEEP + """
const view = deepAll(document, 'tf-hparams-table-view')[0];
const grid = view && view.shadowRoot.querySelector('vaadin-grid');
if (!grid) return null;
const cells = tr => [...tr.querySelectorAll('th, td')].filter(c => !c.hidden).map(c => {
  const slot = c.querySelector('slot');
  const node = slot && slot.assignedNodes()[0];
  return text(node);
});
const head = grid.shadowRoot.querySelector('thead tr');
const rows = [...grid.shadowRoot.querySelectorAll('tbody tr')].filter(tr => !tr.hidden).map(cells)
  .filter(r => r.length && r[0]);
const table = grid.shadowRoot.querySelector('table');
const pane = deepAll(document, 'tf-hparams-query-pane')[0];
const matching = (pane ? deepAll(pane.shadowRoot || pane, 'div') : [])
  .map(text).find(t => /^Number of matching session groups/.test(t)) || '';
return {header: head ? cells(head) : [], rows: rows, size: grid.size || 0, matching: matching,
        overflow: table ? [table.scrollWidth - table.clientWidth, table.scrollHeight - table.clientHeight]
                        : [0, 0]};
"""
JS_METRIC_BOXES = JS_DEEP + """
return deepAll(document, 'paper-checkbox.metric-checkbox').map(b => [text(b), !!b.checked, b]);
"""
JS_GRID_SCROLL = JS_DEEP + """
const view = deepAll(document, 'tf-hparams-table-view')[0];
const grid = view && view.shadowRoot.querySelector('vaadin-grid');
if (grid && grid.scrollToIndex) grid.scrollToIndex(arguments[0]);
"""
JS_CUSTOM_SCALARS = JS_DEEP + """
const dash = deepAll(document, 'tf-custom-scalar-dashboard')[0];
if (!dash) return null;
const root = dash.shadowRoot || dash;
const categories = deepAll(root, 'tf-category-paginated-view').map(v => {
  const heading = v.shadowRoot && v.shadowRoot.querySelector('button.heading');
  return {name: text(v.shadowRoot && v.shadowRoot.querySelector('.category-name')), opened: !!v.opened,
          heading: heading};
});
const cards = deepAll(root, 'tf-custom-scalar-multi-line-chart-card, tf-custom-scalar-margin-chart-card')
  .map(card => {
    const sr = card.shadowRoot;
    const heading = deepAll(sr, '.heading-label.name')[0];
    const chart = deepAll(sr, 'vz-line-chart2')[0];
    const paths = chart && chart.shadowRoot ? deepAll(chart.shadowRoot, 'path') : [];
    const cls = p => (p.getAttribute('class') || '').split(/\\s+/);
    const d = p => p.getAttribute('d') || '';
    const loader = deepAll(sr, 'tf-line-chart-data-loader')[0];
    const matches = (text(deepAll(sr, '.matches-text')[0]).match(/\\((\\d+)\\)/) || [])[1];
    return {title: text(heading) || card.title || '',
            lines: paths.filter(p => cls(p).includes('line') && /L/.test(d(p))).length,
            points: paths.filter(p => cls(p).includes('symbol') && /\\d/.test(d(p))).length,
            matches: matches === undefined ? null : Number(matches),
            loading: !!(loader && loader.dataLoading)};
  });
const container = deepAll(root, '#categories-container')[0];
let overflow = 0;
for (let e = container; e; e = e.parentElement || (e.getRootNode() && e.getRootNode().host)) {
  overflow = Math.max(overflow, e.scrollHeight - e.clientHeight);
}
return {categories: categories, cards: cards, overflow: overflow,
        text: text(root.querySelector ? root.querySelector('#categories-container') : null).slice(0, 300)};
"""
JS_CUSTOM_SCALARS_UNPAGINATE = JS_DEEP + """
const dash = deepAll(document, 'tf-custom-scalar-dashboard')[0];
deepAll(dash.shadowRoot || dash, 'tf-category-paginated-view').forEach(v => { v.disablePagination = true; });
"""


class CheckFailed(AssertionError):
    """A check failed; ``summary`` holds what was found (the CLI prints it)."""

    def __init__(self, message: str, summary: dict[str, Any]) -> None:
        super().__init__(message)
        self.summary = summary


def layout_charts(logdir: str | Path) -> list[tuple[str, str]]:
    """``(category, chart title)`` of the Custom Scalars layout in ``logdir``'s event files.

    Like TensorBoard's custom-scalars plugin: the first layout of each run (here: of each events file), runs
    in sorted order, categories of the same title merged. Charts without a title are left out.
    """
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar.metadata import CONFIG_SUMMARY_TAG

    categories: dict[str, list[Any]] = {}
    files = sorted(p for p in Path(logdir).rglob("*") if p.is_file() and "tfevents" in p.name)
    for path in files:
        layout = _first_layout(EventFileLoader(str(path)).Load(), CONFIG_SUMMARY_TAG, layout_pb2.Layout)
        for category in layout.category if layout is not None else []:
            charts = categories.setdefault(category.title, [])
            charts.extend(c for c in category.chart if c not in charts)
    return [(title, chart.title) for title, charts in categories.items() for chart in charts if chart.title]


def _first_layout(events: Iterator[Any], tag: str, layout_type: type) -> Any:
    for event in events:
        for value in event.summary.value:
            if value.tag == tag and value.tensor.string_val:
                layout = layout_type()
                layout.ParseFromString(value.tensor.string_val[0])
                return layout
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@contextmanager
def tensorboard(logdir: str | Path, runs: int, timeout: float,
                load_fast: str = "auto") -> Iterator[tuple[str, list[str]]]:
    """Run TensorBoard on ``logdir`` until the block ends.

    Yields its URL and runs once it lists ``runs`` runs, or (with those it lists) after ``timeout`` seconds.
    """
    port = _free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="tensorboard_check_", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port),
           "--host", "127.0.0.1", f"--load_fast={load_fast}"]
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        found: list[str] | None = None
        while found is None or len(found) < runs:
            if process.poll() is not None:
                raise RuntimeError(f"TensorBoard exited ({process.returncode}): {_tail(log.name)}")
            try:
                found = _get_json(f"{url}/data/runs")
            except OSError:
                pass
            if time.monotonic() > deadline:
                if found is None:
                    raise RuntimeError(f"TensorBoard at {url} did not answer in {timeout:.0f} s: "
                                       f"{_tail(log.name)}")
                break
            time.sleep(0.5)
        yield url, found
    finally:
        if process.poll() is None:  # its process group: TensorBoard and its data server
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()
        os.unlink(log.name)


def _tail(path: str, lines: int = 15) -> str:
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Selenium ``webdriver.Chrome``), with a fresh profile removed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            raise RuntimeError(f"{path} is missing: apt-get install -y chromium chromium-driver")
    profile = tempfile.mkdtemp(prefix="tensorboard_check_chromium_")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_window_size(*WINDOW)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _wait(condition: Any, timeout: float, every: float = 0.5) -> Any:
    """Call ``condition()`` until it returns something truthy or ``timeout`` passes; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def _number(cell: str) -> float | None:
    try:
        value = float(cell.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _click(driver: Any, element: Any) -> None:
    """Click ``element`` as a user would; where something covers it, by JavaScript."""
    from selenium.common.exceptions import WebDriverException

    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
    try:
        element.click()
    except WebDriverException:
        driver.execute_script("arguments[0].click();", element)


def _resize(driver: Any, width: int, height: int) -> None:
    width = min(max(width, WINDOW[0]), MAX_WINDOW[0])
    height = min(max(height, WINDOW[1]), MAX_WINDOW[1])
    driver.set_window_size(width, height)
    time.sleep(1.0)  # let the page lay itself out again


def check_hparams(driver: Any, url: str, runs: int, metrics: Sequence[str], screenshot: Path,
                  timeout: float, listed: int) -> tuple[dict[str, Any], list[str]]:
    """The HParams dashboard's table: ``runs`` rows, a number for each of ``metrics`` in each row.

    ``listed``: how many runs TensorBoard lists (when under ``runs``, waiting for more rows is pointless).
    """
    driver.get(f"{url}/#hparams")
    errors: list[str] = []

    def table() -> Any:
        return driver.execute_script(JS_HPARAMS_TABLE)

    def ready() -> Any:
        t = table()
        return t if t and t["header"] and t["rows"] and t["size"] >= min(runs, listed) else None

    state = _wait(ready, timeout)
    if not state and listed >= runs:  # the runs' hparams perhaps not all loaded yet: reload the page once
        driver.refresh()
        state = _wait(ready, timeout)
    state = state or table()
    if not state or not state["header"]:
        driver.save_screenshot(str(screenshot))
        return {"rows": 0}, ["HParams: no table (is there an hparams summary in the runs' event files?)"]

    # Only the first 5 metrics are columns at first: tick the others asked for.
    boxes = {name: (checked, element) for name, checked, element in driver.execute_script(JS_METRIC_BOXES)}
    for metric in metrics:
        if metric not in boxes:
            errors.append(f"HParams: metric {metric!r} is not among the experiment's metrics {sorted(boxes)}")
        elif not boxes[metric][0]:
            _click(driver, boxes[metric][1])
    wanted = [m for m in metrics if m in boxes]
    def shown() -> Any:
        t = table()
        return t if t and all(m in t["header"] for m in wanted) else None

    state = _wait(shown, timeout / 2) or table()

    # Rows: those the grid has drawn; scroll it for the others (it draws only what fits).
    rows = {row[0]: row for row in state["rows"]}
    while len(rows) < state["size"]:
        driver.execute_script(JS_GRID_SCROLL, len(rows))
        time.sleep(0.5)
        state = table()
        before = len(rows)
        rows.update({row[0]: row for row in state["rows"]})
        if len(rows) == before:
            break
    header = state["header"]
    values: dict[str, dict[str, float | str | None]] = {}
    for name, row in rows.items():
        values[name] = {}
        for metric in metrics:
            if metric not in header:
                continue
            cell = row[header.index(metric)] if header.index(metric) < len(row) else ""
            number = _number(cell)
            values[name][metric] = number if number is not None else cell
            if number is None:
                errors.append(f"HParams: run {name!r} has no number for {metric!r} (cell {cell!r})")
    for metric in wanted:
        if metric not in header:
            errors.append(f"HParams: metric {metric!r} is not a column of the table (columns: {header})")
    if len(rows) < runs:
        errors.append(f"HParams: {len(rows)} rows ({sorted(rows)}), not at least {runs} "
                      f"({state['matching'] or 'no count shown'})")

    for _ in range(4):  # widen (heighten) the window until the whole table shows (its columns stretch)
        width, height = driver.execute_script("return [window.innerWidth, window.innerHeight];")
        overflow = table()["overflow"]
        if max(overflow) <= 0 or (width, height) >= MAX_WINDOW:
            break
        _resize(driver, width + max(overflow[0], 0) + 20, height + max(overflow[1], 0) + 20)
    driver.save_screenshot(str(screenshot))
    driver.set_window_size(*WINDOW)
    per_row = {run: sum(isinstance(v, float) for v in found.values()) for run, found in values.items()}
    summary = {"dashboard": "hparams (TABLE VIEW)", "rows": len(rows), "columns": header,
               "matching": state["matching"], "metrics_per_row": per_row, "values": values}
    return summary, errors


def check_custom_scalars(driver: Any, url: str, charts: Sequence[str], screenshot: Path,
                         timeout: float) -> tuple[dict[str, Any], list[str]]:
    """The Custom Scalars dashboard: a card for each of ``charts`` (titles), each having drawn a line."""
    driver.get(f"{url}/#custom_scalars")
    errors: list[str] = []

    def page() -> Any:
        return driver.execute_script(JS_CUSTOM_SCALARS)

    state = _wait(lambda: (p := page()) and p["cards"] and p, timeout) or page()
    if not state or not state["cards"]:
        driver.save_screenshot(str(screenshot))
        shown = state["text"] if state else "no Custom Scalars dashboard"
        return {"charts": 0}, [f"Custom Scalars: no charts shown ({shown!r}); expected {list(charts)}"]

    for category in state["categories"]:  # open the collapsed ones
        if not category["opened"]:
            _click(driver, category["heading"])
    driver.execute_script(JS_CUSTOM_SCALARS_UNPAGINATE)
    time.sleep(1.0)
    state = page()
    _resize(driver, WINDOW[0], WINDOW[1] + state["overflow"] + 60)  # every chart in view: all of them load

    def all_drawn() -> Any:
        p = page()
        found = {card["title"] for card in p["cards"]}
        done = all(c["lines"] or c["points"] for c in p["cards"] if c["title"] in charts) and \
            all(title in found for title in charts)
        return p if done else None

    state = _wait(all_drawn, timeout) or page()
    driver.save_screenshot(str(screenshot))
    driver.set_window_size(*WINDOW)

    cards = {card["title"]: card for card in state["cards"]}
    for title in charts:
        if title not in cards:
            errors.append(f"Custom Scalars: no chart titled {title!r} (charts shown: {sorted(cards)})")
        elif not (cards[title]["lines"] or cards[title]["points"]):
            errors.append(f"Custom Scalars: chart {title!r} drew no line ({cards[title]['matches']} matching "
                          f"series{', still loading' if cards[title]['loading'] else ''})")
    closed = [c["name"] for c in state["categories"] if not c["opened"]]
    if closed:
        errors.append(f"Custom Scalars: categories still collapsed: {closed}")
    drawn = [t for t in charts if t in cards and (cards[t]["lines"] or cards[t]["points"])]
    summary = {"categories": [c["name"] for c in state["categories"]], "charts_expected": len(charts),
               "charts_found": sum(title in cards for title in charts), "charts_drawn": len(drawn),
               "charts": {title: {k: card[k] for k in ("lines", "points", "matches")}
                          for title, card in cards.items()}}
    return summary, errors


def check(logdir: str | Path, runs: int, metrics: Sequence[str], out: str | Path, name: str = "tensorboard",
          *, charts: Sequence[str] | None = None, timeout: float = 60.0,
          load_fast: str = "auto") -> dict[str, Any]:
    """Check TensorBoard's HParams table and Custom Scalars charts for ``logdir``; screenshots into ``out``.

    Args:
        logdir: the log root (its runs are folders with events files below it).
        runs: the HParams table must have at least this many rows.
        metrics: hparams metric tags that must be columns with a number in every row.
        out: folder for ``{name}_hparams.png`` and ``{name}_custom_scalars.png`` (made if missing).
        name: the screenshots' prefix.
        charts: the chart titles that must be drawn; by default those of the layout in the event files.
        timeout: seconds to wait for TensorBoard, and for each dashboard to show its data.
        load_fast: TensorBoard's ``--load_fast`` (``auto``, ``true`` or ``false``).

    Returns:
        The summary (rows, metrics per row, charts found and drawn, versions, screenshots, seconds).

    Raises:
        CheckFailed: when a check fails (after both dashboards were checked and their screenshots saved).
        FileNotFoundError, RuntimeError: when the check cannot run (no ``logdir``; TensorBoard or Chromium
            missing or not starting).
    """
    from tensorboard.version import VERSION

    start = time.monotonic()
    if not Path(logdir).is_dir():
        raise FileNotFoundError(f"no log folder {logdir}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    expected = list(charts) if charts is not None else [title for _, title in layout_charts(logdir)]
    summary: dict[str, Any] = {"ok": False, "tensorboard": VERSION, "logdir": str(logdir), "runs": runs,
                               "metrics": list(metrics)}
    errors: list[str] = []
    if not expected:
        errors.append(f"Custom Scalars: no layout (custom_scalars__config__) in {logdir}'s event files, "
                      "and no --charts")
    with tensorboard(logdir, runs, timeout, load_fast) as (url, listed), chromium() as driver:
        summary["chromium"] = driver.capabilities.get("browserVersion")
        summary["tensorboard_runs"] = len(listed)
        shots = {"hparams": out / f"{name}_hparams.png", "custom_scalars": out / f"{name}_custom_scalars.png"}
        summary["hparams"], found = check_hparams(driver, url, runs, metrics, shots["hparams"], timeout,
                                                  len(listed))
        errors += found
        summary["custom_scalars"], found = check_custom_scalars(driver, url, expected,
                                                                shots["custom_scalars"], timeout)
        errors += found
        summary["screenshots"] = [str(path) for path in shots.values()]
    summary["seconds"] = round(time.monotonic() - start, 1)
    summary["ok"] = not errors
    if errors:
        summary["errors"] = errors
        raise CheckFailed("\n".join(errors), summary)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Check in headless Chromium that TensorBoard shows the HParams table (the runs, with a "
                    "number for each metric) and draws every Custom Scalars chart; save screenshots of both.",
        epilog="Exit status: 0 all shown, 1 something missing (named on stderr), 2 the check could not run. "
               "Needs chromium and chromium-driver (apt) and selenium (pip).")
    parser.add_argument("--logdir", required=True, help="the log root TensorBoard reads (runs below it)")
    parser.add_argument("--runs", type=int, required=True, metavar="N",
                        help="the HParams table must list at least N runs")
    parser.add_argument("--metrics", nargs="+", required=True, metavar="TAG",
                        help="hparams metric tags (e.g. rollout/accuracy) that must be columns with a number "
                             "in every row")
    parser.add_argument("--out", required=True, metavar="FOLDER", help="where the screenshots go")
    parser.add_argument("--name", default="tensorboard", metavar="PREFIX",
                        help="screenshots are PREFIX_hparams.png and PREFIX_custom_scalars.png "
                             "(default: %(default)s)")
    parser.add_argument("--charts", nargs="+", metavar="TITLE",
                        help="the Custom Scalars chart titles to expect (default: every titled chart of the "
                             "layout written in the event files)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for TensorBoard and for each dashboard (default: %(default)s)")
    parser.add_argument("--load-fast", choices=["auto", "true", "false"], default="auto",
                        help="TensorBoard's --load_fast (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        summary = check(args.logdir, args.runs, args.metrics, args.out, args.name, charts=args.charts,
                        timeout=args.timeout, load_fast=args.load_fast)
    except CheckFailed as failed:
        print(json.dumps(failed.summary, indent=1))
        print(f"tensorboard_check: FAILED\n{failed}", file=sys.stderr)
        return 1
    except Exception as error:  # the check could not run
        print(f"tensorboard_check: could not check: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
