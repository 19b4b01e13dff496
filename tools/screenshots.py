"""``make screenshots``: every notebook run as a reader runs it, rendered to HTML and photographed
by headless Chromium, so what a user sees is looked at, not only what the tests compare.

Writes ``build/screenshots/NAME.html`` and ``NAME.png`` (the page from its top to its last line,
at most ``--height`` pixels). Each notebook runs in ``notebooks/``, in a kernel of this Python
(the venv's, whatever kernels are installed elsewhere), with the stored outputs replaced.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
from jupyter_client.manager import KernelManager
from nbconvert import HTMLExporter
from nbconvert.preprocessors import ExecutePreprocessor
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# Headless, offline and throwaway: no sandbox (root in CI), no profile, no network of its own.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")
HOW_TO_GET = ("make screenshots needs Chromium: sudo apt-get install chromium (Debian, Ubuntu), "
              "brew install --cask chromium (macOS), or CHROMIUM=/path/to/chrome make screenshots")


def browser() -> str:
    found = os.environ.get("CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
    if not found:
        raise SystemExit(HOW_TO_GET)
    return found


def render(notebook: Path, out: Path) -> Path:
    """Run the notebook top to bottom in its own folder and write its HTML page."""
    book = nbformat.read(notebook, as_version=4)
    kernel = KernelManager(kernel_name="python3")
    # this venv's kernel, never another python3; its notice of an unencrypted localhost is noise
    kernel.kernel_spec.argv[0] = sys.executable
    kernel.kernel_spec.argv.append("--IPKernelApp.log_level=ERROR")
    try:
        ExecutePreprocessor(timeout=600).preprocess(
            book, {"metadata": {"path": str(notebook.parent)}}, km=kernel)
    finally:
        if kernel.has_kernel:
            kernel.shutdown_kernel(now=True)
    page = out / f"{notebook.stem}.html"
    page.write_text(HTMLExporter().from_notebook_node(book)[0], encoding="utf-8")
    return page


def photograph(chromium: str, page: Path, width: int, height: int) -> Path:
    """A screenshot of the page, cut below its last line; says so when the page is longer."""
    png = page.with_suffix(".png")
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}",
                        f"--window-size={width},{height}", f"--screenshot={png}", page.as_uri()],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300,
                       check=False)
    if not png.exists():
        raise SystemExit(f"{chromium} made no screenshot of {page}")
    with Image.open(png) as shot:
        image = shot.convert("RGB")
    bottom = (ImageOps.invert(image).getbbox() or (0, 0, 0, height))[3]
    if bottom >= height - 1:
        print(f"{page.stem} is longer than {height} px: its picture is cut (--height)")
    image.crop((0, 0, width, min(height, bottom + 40))).save(png)
    return png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        default=sorted((ROOT / "notebooks").glob("*.ipynb")))
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "screenshots")
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--height", type=int, default=16000)
    args = parser.parse_args()
    chromium = browser()
    args.out.mkdir(parents=True, exist_ok=True)
    for notebook in args.notebooks:
        png = photograph(chromium, render(notebook.resolve(), args.out.resolve()), args.width,
                         args.height)
        print(os.path.relpath(png))


if __name__ == "__main__":
    main()
