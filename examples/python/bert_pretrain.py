#!/usr/bin/env python3
"""BERT pre-training, DeepSpeed style, with ``import dstransformer as deepspeed``.

A small Pre-LN BERT encoder (torch embeddings, ``dstransformer.torch.TransformerLayer`` layers, a final
LayerNorm, the masked-LM head tied to the word embeddings and the next-sentence head) trained through
``deepspeed.initialize`` exactly as DeepSpeed's bing_bert script does: DeepSpeed's argparse group, its
JSON configuration (Adam, gradient accumulation 2, WarmupLR; fp16 with dynamic loss scaling on a GPU,
bf16 on the CPU), the no-decay parameter groups found by name, ``engine(batch)``,
``engine.backward(loss)``, ``engine.step()`` after every micro-batch, and ``save_checkpoint`` /
``load_checkpoint`` with a client state.

The data is synthetic and learnable: each sequence counts up from a random start (token i+1 follows
token i), 15% of positions masked; the second half of a pair follows the first half or is random.

    PYTHONPATH=build/python python3 examples/python/bert_pretrain.py [--steps 100] [--deepspeed_config F]

It trains, checks that the loss fell, saves a checkpoint halfway, then resumes from it in a fresh model
and checks that the resumed run repeats the last steps' losses exactly. Exit status 0 when both hold.
"""

import argparse
import math
import os
import sys
import tempfile

import torch
from torch import nn
import torch.nn.functional as F

import dstransformer as deepspeed
from dstransformer.torch import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, HIDDEN, LAYERS, HEADS, INTER, SEQ = 64, 64, 2, 4, 128, 24
CLS, SEP, MASK = 1, 2, 3  # special token ids; ordinary tokens are 4 .. VOCAB-1


class BertForPreTraining(nn.Module):
    def __init__(self, ds_config, args):
        super().__init__()
        self.word = nn.Embedding(VOCAB, HIDDEN)
        self.position = nn.Embedding(SEQ, HIDDEN)
        self.token_type = nn.Embedding(2, HIDDEN)
        self.emb_norm = nn.LayerNorm(HIDDEN, eps=1e-12)  # named like BERT's: embeddings.LayerNorm
        self.dropout = nn.Dropout(0.1)
        cfg = DeepSpeedTransformerConfig(
            batch_size=ds_config.train_micro_batch_size_per_gpu, max_seq_length=SEQ, hidden_size=HIDDEN,
            intermediate_size=INTER, heads=HEADS, attn_dropout_ratio=0.1, hidden_dropout_ratio=0.1,
            num_hidden_layers=LAYERS, initializer_range=0.02, local_rank=-1, seed=args.seed,
            fp16=ds_config.fp16_enabled, dtype="bf16" if ds_config.bf16_enabled else None, pre_layer_norm=True)
        layer = DeepSpeedTransformerLayer(cfg, device=args.device)
        self.layer = nn.ModuleList([layer] + [DeepSpeedTransformerLayer(cfg, device=args.device)
                                              for _ in range(LAYERS - 1)])
        self.final_norm = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.pooler = nn.Linear(HIDDEN, HIDDEN)
        self.transform = nn.Linear(HIDDEN, HIDDEN)
        self.transform_norm = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.decoder_bias = nn.Parameter(torch.zeros(VOCAB))
        self.nsp = nn.Linear(HIDDEN, 2)
        for m in (self.word, self.position, self.token_type):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, batch):
        input_ids, input_mask, segment_ids, nsp_labels, mlm_labels = batch
        B, S = input_ids.shape
        pos = torch.arange(S, device=input_ids.device).unsqueeze(0)
        h = self.word(input_ids) + self.position(pos) + self.token_type(segment_ids)
        h = self.dropout(self.emb_norm(h))
        mask = (1.0 - input_mask[:, None, None, :].to(h.dtype)) * -10000.0  # DeepSpeed's extended mask
        for layer in self.layer:
            h = layer(h, mask)
        h = self.final_norm(h)
        pooled = torch.tanh(self.pooler(h[:, 0]))
        picked = mlm_labels.reshape(-1) != -1  # only the masked positions go through the MLM head
        t = self.transform_norm(F.gelu(self.transform(h.reshape(-1, HIDDEN)[picked])))
        logits = t @ self.word.weight.t() + self.decoder_bias
        mlm = F.cross_entropy(logits.float(), mlm_labels.reshape(-1)[picked])
        nsp = F.cross_entropy(self.nsp(pooled).float(), nsp_labels)
        return mlm + nsp


def make_batches(n, micro, seed, device):
    """``n`` micro-batches of counting sequences, masked as BERT masks (15%, at least one)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    half = (SEQ - 3) // 2
    for _ in range(n):
        ids = torch.zeros(micro, SEQ, dtype=torch.long)
        seg = torch.zeros(micro, SEQ, dtype=torch.long)
        nsp = torch.randint(0, 2, (micro,), generator=g)
        for b in range(micro):
            start = int(torch.randint(4, VOCAB, (1,), generator=g))
            first = [(start - 4 + i) % (VOCAB - 4) + 4 for i in range(half)]
            nxt = first[-1] + 1
            if nsp[b] == 1:  # a random second half
                nxt = int(torch.randint(4, VOCAB, (1,), generator=g))
            second = [(nxt - 4 + i) % (VOCAB - 4) + 4 for i in range(half)]
            toks = [CLS] + first + [SEP] + second + [SEP]
            ids[b, :len(toks)] = torch.tensor(toks)
            seg[b, half + 2:len(toks)] = 1
        input_mask = (ids != 0).long()
        labels = torch.full_like(ids, -1)
        cand = (ids > SEP)
        pick = (torch.rand(ids.shape, generator=g) < 0.15) & cand
        pick[:, 1] = True  # at least one per sequence
        labels[pick] = ids[pick]
        ids = ids.masked_fill(pick, MASK)
        out.append(tuple(t.to(device) for t in (ids, input_mask, seg, nsp, labels)))
    return out


def optimizer_groups(model):
    """bing_bert's prepare_optimizer_parameters: no weight decay for biases and LayerNorm parameters
    (the kernel layer's names included); the pooler is left out of the optimizer."""
    no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight", "norm.weight", "norm.bias",
                "attn_nw", "attn_nb", "norm_w", "norm_b", "attn_qkvb", "attn_ob", "inter_b", "output_b"]
    named = [(n, p) for n, p in model.named_parameters() if "pooler" not in n]
    return [
        {"params": [p for n, p in named if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in named if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]


def build(args):
    torch.manual_seed(args.seed)
    ds_config = deepspeed.DeepSpeedConfig(args.deepspeed_config)
    model = BertForPreTraining(ds_config, args)
    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model,
                                                   model_parameters=optimizer_groups(model))
    return engine, optimizer


def train(engine, batches, first, last):
    """Micro-batches first .. last-1 (a boundary every gradient_accumulation_steps); the loss of the last
    micro-batch of each boundary step."""
    losses = []
    engine.train()
    for i in range(first, last):
        loss = engine(batches[i % len(batches)])
        engine.backward(loss)
        boundary = engine.is_gradient_accumulation_boundary()
        engine.step()
        if boundary:
            losses.append(float(loss))
    return losses


def torch_rng_state():
    """torch's RNG state (the embedding dropout draws from it) as JSON-friendly lists. A DeepSpeed
    checkpoint does not hold it, so the script keeps it in its client state to resume exactly; the
    library's layers keep their dropout stream in the checkpoint itself."""
    state = {"cpu": torch.get_rng_state().tolist()}
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_torch_rng_state(state):
    torch.set_rng_state(torch.tensor(state["cpu"], dtype=torch.uint8))
    if "cuda" in state:
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (each of GAS micro-batches)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when usable)")
    parser.add_argument("--output_dir", default=None, help="checkpoint folder (default: a temporary one)")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and deepspeed.cuda_device_count() > 0
    if args.device is None:
        args.device = "cuda" if cuda else "cpu"
    if args.deepspeed_config is None:
        args.deepspeed_config = os.path.join(HERE, "bert_pretrain_cuda.json" if args.device == "cuda"
                                             else "bert_pretrain_cpu.json")
    deepspeed.init_distributed(dist_backend="nccl")

    engine, optimizer = build(args)
    gas = engine.gradient_accumulation_steps()
    print(f"train_batch_size {engine.train_batch_size()}, micro {engine.train_micro_batch_size_per_gpu()}, "
          f"gradient_accumulation_steps {gas}, fp16 {engine.fp16_enabled()}, bf16 {engine.bf16_enabled()}, "
          f"{sum(len(g['params']) for g in optimizer.param_groups)} tensors in "
          f"{len(optimizer.param_groups)} groups, device {engine.device}")
    batches = make_batches(16, engine.train_micro_batch_size_per_gpu(), args.seed + 1, engine.device)
    half = args.steps // 2
    with tempfile.TemporaryDirectory() as tmp:
        save_dir = args.output_dir or tmp
        losses = train(engine, batches, 0, half * gas)
        engine.save_checkpoint(save_dir, f"epoch0_step{engine.global_steps}",
                               client_state={"epoch": 0, "last_global_step": engine.global_steps,
                                             "last_global_data_samples": engine.global_samples,
                                             "losses": losses, "torch_rng": torch_rng_state()})
        losses += train(engine, batches, half * gas, args.steps * gas)
        for step, loss in enumerate(losses):
            if step % 10 == 0 or step == len(losses) - 1:
                print(f"bing_bert_progress: step={step + 1}, loss={loss:.5f}")
        print(f"after {engine.global_steps} steps: lr {engine.get_lr()[0]:.3e}, loss scale "
              f"{engine.loss_scale:g}, skipped steps {engine.skipped_steps}")

        # resume: a fresh model and engine, the checkpoint, the same data from the same position
        resumed, _ = build(args)
        path, client = resumed.load_checkpoint(save_dir)  # the tag from save_dir/latest
        set_torch_rng_state(client["torch_rng"])
        again = train(resumed, batches, half * gas, args.steps * gas)
    print(f"resumed from {os.path.relpath(path, save_dir)} at global step {client['last_global_step']}")
    first, tail = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    ok = True
    if not (math.isfinite(tail) and tail < 0.8 * first):
        print(f"FAIL: the loss did not fall (first steps {first:.4f}, last steps {tail:.4f})")
        ok = False
    if again != losses[half:]:
        print(f"FAIL: the resumed run differs: {again} vs {losses[half:]}")
        ok = False
    if client["losses"] != losses[:half]:
        print("FAIL: the client state did not round-trip")
        ok = False
    if ok:
        print(f"loss {first:.4f} -> {tail:.4f}; the resumed run repeats the last {len(again)} losses exactly")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
