"""A chat whose image URL is fetched while its model is replaced (docs/models.md,
"Replacing a loaded model"; docs/decisions/0042): the request looked the model up before
the fetch and admits after it, so it must be admitted on the new version, not refused by
the old one's closed admission. A real ``zeroserve serve --models-dir`` process, the
loopback image server's ``/gated`` image held until the replace is done, and httpx."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support import model_scaled, scaled, start_server
from tests.support.image_server import image_server
from tests.support.vision import write_projector

pytest.importorskip("xllamacpp")

# Its loads and its chat run on SmolLM2's niced threads: their bounds, and pytest-timeout's,
# are scaled by model_slowdown (docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
pytestmark = pytest.mark.niced

# The longest a load of SmolLM2 with its projector may take on a loaded machine.
LOAD_WAIT_S = 60.0


def _eye(models: Path, projector: Path, n_ctx: int) -> None:
    folder = models / "eye"
    folder.mkdir(exist_ok=True)
    (folder / "model.toml").write_text(
        f'spec = "smollm2"\n[options]\nmmproj = "{projector}"\nn_ctx = {n_ctx}\nparallel = 1\n'
    )


def test_a_chat_fetching_an_image_during_a_replace_is_served_by_the_new_version(
    tmp_path: Path,
) -> None:
    projector = write_projector(tmp_path / "mmproj.gguf")
    models = tmp_path / "models"
    models.mkdir()
    _eye(models, projector, 1024)
    with image_server() as images:
        server = start_server(
            "--models-dir", str(models), "--model", "echo",
            "--allow-image-urls", "127.0.0.1", "--allow-image-urls-loopback",
        )  # fmt: skip
        try:
            with httpx.Client(base_url=server.url, timeout=model_scaled(LOAD_WAIT_S)) as http:
                assert http.post("/models/load", json={"model": "eye"}).status_code == 200
                url = f"http://127.0.0.1:{images.server_address[1]}/gated"
                body = {
                    "model": "eye",
                    "max_tokens": 2,
                    "messages": [
                        {
                            "role": "user",
                            "content": [{"type": "image_url", "image_url": {"url": url}}],
                        }
                    ],
                }
                with ThreadPoolExecutor(1) as pool:
                    chat = pool.submit(http.post, "/v1/chat/completions", json=body)
                    # The chat has looked "eye" up and waits for its image.
                    assert images.asked.wait(scaled(LOAD_WAIT_S))
                    _eye(models, projector, 2048)
                    r = http.post("/v2/repository/index")
                    assert r.status_code == 200, r.text
                    r = http.post("/models/load", json={"model": "eye"})
                    assert r.status_code == 200, r.text  # the new version serves
                    images.gate.set()
                    answer = chat.result(model_scaled(LOAD_WAIT_S))
                assert answer.status_code == 200, answer.text
                assert answer.json()["usage"]["prompt_tokens"] > 0
        finally:
            assert server.stop() == 0
