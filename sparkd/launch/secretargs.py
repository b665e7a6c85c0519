"""A secret in ``[launch] extra_args`` reaches vLLM's command line, which every user on the host can read
(``/proc/PID/cmdline``), and the journal and ``status.json`` with it (security review 2, #19). A lint error,
with the sentence saying where the value goes instead. Pure."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sparkd.config.secretrule import secret_flag

RULE = "secret-in-argv"
# Where vLLM (or the hub client inside it) reads each flag's value from instead of its command line.
_INSTEAD = {
    "--api-key": "set [launch] api_key_file (a file of root's, mode 0600): sparkd gives vLLM the key as VLLM_API_KEY",
    "--hf-token": "set HF_TOKEN in [launch.env] (or [container] env): the hub client reads it from the environment",
}
_ANY = ("pass it through the environment variable vLLM reads for it, in [launch.env] (or [container] env); a name "
        "the secret rule does not know goes into [launch] secret_env too")


def secret_args(words: Sequence[str]) -> Iterator[tuple[str, str]]:
    """(the flag, the sentence) for each secret flag in ``words`` that carries a value."""
    for i, word in enumerate(words):
        flag = secret_flag(word)
        if flag is None:
            continue
        valued = "=" in word or (i + 1 < len(words) and not words[i + 1].startswith("-"))
        if valued:
            yield flag, (f"{flag} puts a secret on vLLM's command line, which every user of the host can read "
                         f"(/proc/PID/cmdline) and which reaches the journal and status: "
                         f"{_INSTEAD.get(flag, _ANY)}")
