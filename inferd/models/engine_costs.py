"""What a generation engine's work costs, learnt from what it runs: the figures admission predicts
time to first token (TTFT) and time per output token (TPOT) from.

A continuous-batching engine is bound by two things a batch model does not have: its prefill (prompt
tokens it reads, sharing steps with decoding) and its step (one output token for every running
sequence, slower as more run). Both are read from the engine's own output, whatever the engine:

- the **step time** against the running sequences, a least-squares line through every output token's
  interval (time since the request's previous delta, per token), so that admission can ask what a
  step will take once a request has joined;
- the **prefill time per prompt token**, from requests that found a free place in the engine: their
  time to first token less two steps (the one in progress, the one that makes the token), over their
  prompt's tokens;
- the share of `max_tokens` a request really produces (a stop ends it earlier), and tokens per
  character of prompt (to judge a prompt before it is tokenised).

Every figure is a mean weighted by age (half of its weight gone every `HALF_LIFE_S`) beside a prior
that never fades but counts as one observation: a change of engine speed is followed within seconds,
up and back down, and no figure locks itself in (a model that refuses everything still has its
running requests to learn from, and with nothing running the prior is all that is left). Written and
read on the event loop.
"""

from __future__ import annotations

import math

HALF_LIFE_S = 5.0
PRIOR_STEP_S = 0.02  # a step's time before any is seen (a GPU's: 10-30 ms)
PRIOR_PREFILL_S = 1 / 10_000  # a prompt token's prefill before any is seen
PRIOR_OUTPUT_SHARE = 1.0  # of max_tokens, before any request has ended: the whole (the safe side)
PRIOR_TOKENS_PER_CHAR = 0.5
_TAU = HALF_LIFE_S / math.log(2)


class AgedMean:
    """A ratio of sums weighted by age (y over x, each observation's weight halving every half-life),
    with a prior that counts as one observation of `prior_x` and never fades."""

    def __init__(self, prior: float, prior_x: float = 1.0) -> None:
        self._prior_x, self._prior_y = prior_x, prior * prior_x
        self._x = self._y = 0.0
        self._at = 0.0

    def observe(self, y: float, x: float, at: float) -> None:
        self._fade(at)
        self._x += x
        self._y += y

    def _fade(self, at: float) -> None:
        if at > self._at:
            shrink = math.exp(-(at - self._at) / _TAU)
            self._x *= shrink
            self._y *= shrink
            self._at = at

    @property
    def value(self) -> float:
        return (self._y + self._prior_y) / (self._x + self._prior_x)


class StepTimes:
    """A step's time as `fixed + per_sequence * running`: a least-squares line through the observed
    steps, weighted by age, beside a flat prior at `PRIOR_STEP_S` (two observations, at one sequence
    and at `span`), so that a line seen at one running count only is flat, and a slope is learnt only
    from steps seen at different counts. The slope is never below 0."""

    def __init__(self, span: int = 64, prior_s: float = PRIOR_STEP_S) -> None:
        self._prior = [(1.0, prior_s), (float(max(2, span)), prior_s)]
        self._w = self._wn = self._wnn = self._wy = self._wny = 0.0
        self._at = 0.0
        self.observed = 0
        self._line: tuple[float, float] | None = None

    def observe(self, running: int, step_s: float, at: float) -> None:
        if at > self._at:
            shrink = math.exp(-(at - self._at) / _TAU)
            self._w *= shrink
            self._wn *= shrink
            self._wnn *= shrink
            self._wy *= shrink
            self._wny *= shrink
            self._at = at
        n = float(running)
        self._w += 1.0
        self._wn += n
        self._wnn += n * n
        self._wy += step_s
        self._wny += n * step_s
        self.observed += 1
        self._line = None

    def line(self) -> tuple[float, float]:
        """(fixed seconds, seconds per running sequence)."""
        if self._line is None:
            w, wn, wnn, wy, wny = self._w, self._wn, self._wnn, self._wy, self._wny
            for n, y in self._prior:
                w, wn, wnn, wy, wny = w + 1, wn + n, wnn + n * n, wy + y, wny + n * y
            det = w * wnn - wn * wn
            slope = max(0.0, (w * wny - wn * wy) / det) if det > 1e-9 else 0.0
            fixed = (wy - slope * wn) / w
            if fixed < 0.0:  # (a line through the origin instead: never a step of no time)
                fixed, slope = 0.0, wny / wnn if wnn > 0 else 0.0
            self._line = (fixed, slope)
        return self._line

    def at(self, running: int) -> float:
        fixed, slope = self.line()
        return fixed + slope * max(1, running)


class EngineCosts:
    """One generation model's learnt costs (see the module's docstring)."""

    def __init__(self, span: int = 64) -> None:
        self.steps = StepTimes(span)
        self._prefill = AgedMean(PRIOR_PREFILL_S, 256.0)  # seconds over prompt tokens
        self._output_share = AgedMean(PRIOR_OUTPUT_SHARE)
        self._tokens_per_char = AgedMean(PRIOR_TOKENS_PER_CHAR, 100.0)
        self._prompt = AgedMean(64.0)  # prompt tokens
        self._service = AgedMean(1.0)  # seconds a request holds its place: from its first token to its last, and a step

    def step_s(self, running: int) -> float:
        return self.steps.at(running)

    @property
    def prefill_s_per_token(self) -> float:
        return self._prefill.value

    def prefill_s(self, tokens: int) -> float:
        return tokens * self._prefill.value

    def expected_output(self, max_tokens: int) -> float:
        return max(1.0, min(1.0, self._output_share.value) * max_tokens)

    def prompt_tokens(self, chars: int) -> int:
        """A prompt's tokens judged from its characters, before it is tokenised."""
        return max(1, round(chars * self._tokens_per_char.value))

    # ---- what the engine did ---------------------------------------------------------------------

    def observe_step(self, running: int, per_token_s: float, at: float) -> None:
        self.steps.observe(running, per_token_s, at)

    def observe_first_token(self, prompt_tokens: int, ttft_s: float, running: int, at: float) -> None:
        """A request that found a free place: its prefill is its first token's time less two steps (the
        one in progress when it came, and the one that made its first token)."""
        self._prefill.observe(max(0.0, ttft_s - 2 * self.step_s(running)), float(prompt_tokens), at)

    def observe_output(self, made: int, max_tokens: int, at: float) -> None:
        if max_tokens > 0:
            self._output_share.observe(min(1.0, made / max_tokens), 1.0, at)

    def observe_prompt(self, tokens: int, chars: int, at: float) -> None:
        if chars > 0:
            self._tokens_per_char.observe(float(tokens), float(chars), at)
        self._prompt.observe(float(tokens), 1.0, at)

    def observe_service(self, seconds: float, at: float) -> None:
        self._service.observe(seconds, 1.0, at)

    @property
    def service_s(self) -> float:
        """How long a request holds its place in the engine, recently."""
        return self._service.value

    @property
    def typical_prompt_tokens(self) -> int:
        """The recent prompts' mean length."""
        return max(1, round(self._prompt.value))

    def describe(self) -> dict[str, float | None]:
        fixed, slope = self.steps.line()
        return {"step_ms_fixed": round(fixed * 1000, 3), "step_ms_per_sequence": round(slope * 1000, 4),
                "prefill_tokens_per_s": round(1 / self.prefill_s_per_token) if self.prefill_s_per_token > 0 else None,
                "output_share": round(min(1.0, self._output_share.value), 3),
                "tokens_per_char": round(self._tokens_per_char.value, 3)}
