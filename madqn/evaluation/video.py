"""Videos of agents playing: rendered frames with a caption bar of every agent's running score.

``record_episodes(env, act_fn, path, episodes, max_steps)`` is the one call evaluation code needs:
it plays whole episodes (one frame after reset, one per env step, as ``env.render()`` returns
them, or the observation image for envs without ``render()``; for Atari the newest RGB screen,
i.e. one frame per agent step = 15 frames per emulated second) and writes ``.mp4`` (H.264 through imageio-ffmpeg) or ``.gif`` (pillow; keep GIFs short,
every frame is held until the file is closed). ``VideoWriter`` is the lower level: frames and
scores in, a captioned video out. ``VideoHook`` records one episode of the current networks every
``video_freq`` agent steps of training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import cv2
import numpy as np

from madqn.envs.adapters import make_env
from madqn.errors import MadqnError
from madqn.evaluation.agents import Agents
from madqn.training.trainer import Hook, Trainer

VIDEO_SUFFIXES = (".mp4", ".gif")
FONT = cv2.FONT_HERSHEY_SIMPLEX
BLOCK = 16  # H.264 encoders want frame sides that are multiples of 16


def check_video_path(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        raise MadqnError(f"video file {path} must end in .mp4 or .gif")
    return path


def format_score(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def as_rgb(frame: Any) -> np.ndarray:
    """A rendered frame as (H, W, 3) uint8; one clear error for envs that do not render pixels."""
    if frame is None:
        raise MadqnError("the env's render() returned None: create it with render_mode='rgb_array' to record videos")
    frame = np.asarray(frame)
    if frame.dtype != np.uint8 or frame.ndim not in (2, 3) or (frame.ndim == 3 and frame.shape[2] not in (1, 3, 4)):
        raise MadqnError(f"the env's render() returned {frame.dtype} {frame.shape}, not an RGB image "
                         "(H, W, 3) uint8; create the env with render_mode='rgb_array'")
    if frame.ndim == 2:
        frame = frame[:, :, None]
    if frame.shape[2] == 1:
        frame = np.repeat(frame, 3, axis=2)
    return np.ascontiguousarray(frame[:, :, :3])


def observation_image(observation: Any) -> np.ndarray | None:
    """An observation as an (H, W, 3) uint8 image, or None when it is no image (a vector, a scalar).

    Accepts ``{"observation": ...}`` dicts, (H, W), (H, W, C) and (C, H, W) arrays with C in 1, 3, 4;
    other dtypes are scaled by 255 / max(1, their maximum): 0..1 data to 0..255, larger ranges by their maximum.
    """
    if isinstance(observation, Mapping):
        observation = observation.get("observation")
    if observation is None:
        return None
    x = np.asarray(observation)
    if x.ndim == 3 and x.shape[2] not in (1, 3, 4) and x.shape[0] in (1, 3, 4):
        x = np.moveaxis(x, 0, -1)
    if x.ndim not in (2, 3) or min(x.shape[:2]) < 2 or (x.ndim == 3 and x.shape[2] not in (1, 3, 4)):
        return None
    if x.dtype != np.uint8:
        if not np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_:
            x = x.astype(np.float32)
        top = float(np.max(x)) if x.size else 0.0
        x = np.clip(np.asarray(x, np.float32) * (255.0 / max(top, 1.0)), 0, 255).astype(np.uint8)
    return as_rgb(x)


class FrameSource:
    """The frames of a video: ``env.render()``, or, for an env without ``render()`` (PettingZoo's
    default raises NotImplementedError; one made without ``render_mode`` returns None), the
    observation image of the first agent that has one (VideoWriter scales it up)."""

    def __init__(self, env: Any):
        self.env = env
        self.rendering = True
        self.last: dict[str, Any] = {}

    def frame(self, observations: Mapping[str, Any]) -> np.ndarray:
        self.last.update(observations)
        if self.rendering:
            try:
                rendered = self.env.render()
            except NotImplementedError:
                rendered = None
            if rendered is not None:
                return as_rgb(rendered)
            self.rendering = False
        for agent in list(getattr(self.env, "possible_agents", [])) + list(self.last):
            image = observation_image(self.last.get(agent))
            if image is not None:
                return image
        raise MadqnError("the env has no render() and its observations are not images: there is nothing to "
                         "record (give the env a render() returning RGB, with render_mode='rgb_array')")


class VideoWriter:
    """Writes captioned frames to ``path`` (.mp4 or .gif); ``close()`` returns the number of frames.

    Each frame is scaled by ``scale`` (nearest neighbour; default: at least 320 pixels wide) under
    a black caption bar holding ``agent score`` for every agent in ``agents`` and a free ``note``
    (e.g. the episode and step). The layout is fixed by the first frame, so every frame of the
    video has the same size, padded to multiples of 16 pixels.
    """

    def __init__(self, path: str | Path, agents: Sequence[str], fps: float = 15.0, scale: int | None = None):
        self.path = check_video_path(path)
        self.line_type = cv2.LINE_8 if self.path.suffix.lower() == ".gif" else cv2.LINE_AA  # GIF: few exact colours
        self.agents = list(agents)
        self.fps = float(fps)
        self.scale = scale
        self.frames = 0
        self._writer = None
        self._shape: tuple[int, int] | None = None

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _layout(self, height: int, width: int) -> None:
        if self.scale is None:
            self.scale = max(1, math.ceil(320 / width))
        self._shape = (height, width)
        w = width * self.scale
        self.font_scale = 0.5
        cells = [f"{a} -9999" for a in self.agents] + ["ep 99/99 t 99999"]
        sizes = [cv2.getTextSize(c, FONT, self.font_scale, 1)[0] for c in cells]
        self.cell_w = max(s[0] for s in sizes) + 14
        text_h = max(s[1] for s in sizes)
        self.line_h = text_h + 12
        self.per_line = max(1, w // self.cell_w)
        lines = math.ceil(len(cells) / self.per_line)
        self.bar_h = lines * self.line_h
        self.canvas = np.zeros((_round_up(self.bar_h + height * self.scale), _round_up(w), 3), np.uint8)

    def add(self, frame: Any, scores: Mapping[str, float], note: str = "") -> None:
        frame = as_rgb(frame)
        if self._shape is None:
            self._layout(*frame.shape[:2])
            self._open()
        elif frame.shape[:2] != self._shape:
            raise MadqnError(f"rendered frame size changed from {self._shape} to {frame.shape[:2]} mid-video")
        c, s = self.canvas, self.scale
        c[:] = 0
        h, w = frame.shape[:2]
        c[self.bar_h:self.bar_h + h * s, :w * s] = frame if s == 1 else cv2.resize(
            frame, (w * s, h * s), interpolation=cv2.INTER_NEAREST)
        texts = [f"{a} {format_score(scores.get(a, 0.0))}" for a in self.agents] + [note]
        for k, text in enumerate(texts):
            x = (k % self.per_line) * self.cell_w + 6
            y = (k // self.per_line + 1) * self.line_h - 7
            cv2.putText(c, text, (x, y), FONT, self.font_scale, (255, 255, 255), 1, self.line_type)
        self._writer.append_data(c)
        self.frames += 1

    def _open(self) -> None:
        import imageio.v2 as imageio

        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.suffix.lower() == ".gif":
            self._writer = _GifFile(self.path, self.fps)
        else:
            self._writer = imageio.get_writer(self.path, format="FFMPEG", mode="I", fps=self.fps, codec="libx264",
                                              macro_block_size=BLOCK, ffmpeg_log_level="error")

    def close(self) -> int:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return self.frames


class _GifFile:
    """GIF through pillow, all frames written on close (one byte per pixel is held meanwhile).

    A frame with at most 256 colours (Atari screens have a handful; captions on GIFs are drawn
    without anti-aliasing) gets an exact palette, so the GIF holds the rendered pixels unchanged;
    richer frames are quantized (pillow's fast octree).
    """

    def __init__(self, path: Path, fps: float):
        self.path = path
        self.duration_ms = 1000.0 / fps
        self.images: list = []

    def append_data(self, frame: np.ndarray) -> None:
        from PIL import Image

        packed = (frame[:, :, 0].astype(np.uint32) << 16) | (frame[:, :, 1].astype(np.uint32) << 8) | frame[:, :, 2]
        colours, index = np.unique(packed, return_inverse=True)
        if colours.size <= 256:
            image = Image.fromarray(index.reshape(packed.shape).astype(np.uint8), mode="P")
            palette = np.stack([colours >> 16, (colours >> 8) & 255, colours & 255], axis=1).astype(np.uint8)
            image.putpalette(palette.tobytes())
        else:
            image = Image.fromarray(frame).quantize(256, method=Image.Quantize.FASTOCTREE)
        self.images.append(image)

    def close(self) -> None:
        if self.images:
            self.images[0].save(self.path, save_all=True, append_images=self.images[1:], duration=self.duration_ms,
                                loop=0, optimize=False)
        self.images = []


def _round_up(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


@dataclass
class Recording:
    path: Path
    frames: int
    episode_scores: list[dict[str, float]] = field(default_factory=list)  # raw score per agent, per episode
    episode_steps: list[int] = field(default_factory=list)  # env steps played, per episode


def record_episodes(env: Any, act_fn: Callable[[dict, dict], Mapping[str, int]], path: str | Path,
                    episodes: int = 1, max_steps: int | None = None, *,
                    reset_fn: Callable[[], None] | None = None, fps: float | None = None,
                    scale: int | None = None, note: str = "") -> Recording:
    """Play ``episodes`` episodes of ``env`` and write every rendered frame, captioned with the scores.

    ``env``: madqn's internal env interface (``madqn.envs.adapters.make_env``) whose ``render()`` returns RGB
    (or, without ``render()``, whose observations are images: ``FrameSource``).
    ``act_fn(observations, infos)`` gets the live agents' newest observations and returns their
    actions (e.g. ``lambda obs, infos: agents.act(obs, infos, 0.05)`` with ``madqn.load_agents``);
    ``reset_fn`` runs at every episode start.
    An episode stops when no agent is live or after ``max_steps`` env steps. Frames written:
    ``sum(steps + 1)`` over the episodes. Scores are raw (unclipped) sums per agent.
    """
    if episodes < 1:
        raise MadqnError(f"episodes must be >= 1, got {episodes}")
    if max_steps is not None and max_steps < 1:
        raise MadqnError(f"max_steps must be >= 1, got {max_steps}")
    fps = fps or float(getattr(env, "metadata", {}).get("render_fps", 15) or 15)
    agents = list(env.possible_agents)
    recording = Recording(Path(path), 0)
    frames = FrameSource(env)
    with VideoWriter(path, agents, fps=fps, scale=scale) as video:
        for episode in range(episodes):
            observations, infos = env.reset()
            if reset_fn is not None:
                reset_fn()
            scores = {a: 0.0 for a in agents}
            steps = 0
            label = f"{note + ' ' if note else ''}ep {episode + 1}/{episodes}"
            video.add(frames.frame(observations), scores, f"{label} t {steps}")
            while env.agents and (max_steps is None or steps < max_steps):
                live = [a for a in observations if a in env.agents]
                actions = dict(act_fn({a: observations[a] for a in live}, {a: infos.get(a, {}) for a in live}))
                observations, rewards, _, _, infos = env.step(actions)
                for agent, reward in rewards.items():
                    scores[agent] += float(reward)
                steps += 1
                video.add(frames.frame(observations), scores, f"{label} t {steps}")
            recording.episode_scores.append(scores)
            recording.episode_steps.append(steps)
    recording.frames = video.frames
    return recording


class VideoHook(Hook):
    """Every ``video_freq`` agent steps (0: never), ``videos/step_<step>.mp4``: one episode of the current
    online networks at epsilon ``eval_ep``, cut at ``video_length`` steps, in a separate env copy.

    The env is built (and checked to render RGB) at the start of training, so a misconfigured env
    fails before any training. Acting uses its own RNG: training is the same with or without videos.
    """

    def __init__(self, run_dir: Path, suffix: str = ".mp4"):
        self.dir = Path(run_dir) / "videos"
        self.suffix = suffix
        self.env = None
        self.paths: list[Path] = []

    def on_start(self, trainer: Trainer) -> None:
        c = trainer.config
        if c.video_freq == 0:
            return
        from pettingzoo import AECEnv, ParallelEnv

        if isinstance(trainer.env_spec, (ParallelEnv, AECEnv)):
            raise MadqnError("video_freq needs the env as a spec string or a factory (a function returning the env), "
                             "not an env instance: recording must not step the training env")
        self.env = make_env(trainer.env_spec, c.replace(terminal_on_life_loss=False), seed=c.seed + 7919, convert=False)
        FrameSource(self.env).frame(self.env.reset()[0])  # renders, or has observation images
        self.next_video = (trainer.step // c.video_freq + 1) * c.video_freq

    def on_step(self, trainer: Trainer) -> None:
        if self.env is not None and trainer.step >= self.next_video:
            self.record(trainer)
            self.next_video = (trainer.step // trainer.config.video_freq + 1) * trainer.config.video_freq

    def record(self, trainer: Trainer) -> Recording:
        c = trainer.config
        agents = Agents.from_trainer(trainer, seed=c.seed + trainer.step)
        path = self.dir / f"step_{trainer.step:09d}{self.suffix}"
        recording = record_episodes(self.env, lambda obs, infos: agents.act(obs, infos, c.eval_ep), path, 1,
                                    c.video_length, reset_fn=agents.reset, note=f"step {trainer.step}")
        self.paths.append(path)
        return recording

    def on_end(self, trainer: Trainer) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
