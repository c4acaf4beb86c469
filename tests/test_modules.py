"""Module attribution: every FX node and IR op knows the ``nn.Module`` it came from."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

import tkx


class RMSNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.proj = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / (d // self.heads) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.attn, self.ln2 = RMSNorm(d), Attention(d, heads), RMSNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=32, d=16, heads=2, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def gpt_step_inputs(layers=2):
    torch.manual_seed(0)
    model = TinyGPT(layers=layers)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    tokens = torch.randint(0, 32, (2, 8))
    targets = torch.randint(0, 32, (2, 8))

    def step(params, tokens, targets):
        def loss_fn(p):
            logits = torch.func.functional_call(model, p, (tokens,))
            return F.cross_entropy(logits.reshape(-1, 32), targets.reshape(-1))
        grads, loss = torch.func.grad_and_value(loss_fn)(params)
        return loss, {k: p - 0.1 * grads[k] for k, p in params.items()}

    return step, (params, tokens, targets)


def test_tiny_gpt_ops_carry_their_modules():
    step, inputs = gpt_step_inputs(layers=2)
    cg = tkx.capture(step, inputs)
    prog = cg.program
    fwd = [op for op in prog.ops if op.region == "forward"]
    # three RMSNorm instances (two per block, one final) told apart by path
    norms = {op.module for op in fwd if op.module_type == "RMSNorm"}
    assert norms == {"blocks.0.ln1", "blocks.0.ln2", "blocks.1.ln1", "blocks.1.ln2", "norm"}
    assert {op.module for op in fwd if op.kind == "rsqrt"} == norms
    assert any(op.module == "blocks.1.attn" and op.module_type == "Attention" and op.kind == "exp" for op in fwd)
    assert any(op.module == "blocks.0.attn.qkv" and op.module_type == "Linear" for op in fwd)
    assert prog.modules["blocks.1.attn"] == "Attention" and prog.modules[""] == "TinyGPT"
    # backward ops take the module of the forward op they differentiate
    bwd = [op for op in prog.ops if op.region == "backward"]
    assert {"blocks.0.ln1", "blocks.1.attn", "blocks.1.mlp.0", "head"} <= {op.module for op in bwd}
    assert sum(op.module is not None for op in bwd) > 0.8 * len(bwd)
    # optimizer ops the module of their parameter
    opt = [op for op in prog.ops if op.region == "optimizer"]
    assert opt and all(op.module is not None for op in opt)
    assert {"blocks.1.attn.qkv", "blocks.0.ln2", "head", "embed"} <= {op.module for op in opt}
    # the FX nodes carry the same attribution
    by_name = {n.name: n for n in cg.nodes}
    for op in prog.ops:
        if op.fx_node in by_name:
            assert by_name[op.fx_node].module == op.module


def test_dict_of_params_step_takes_modules_from_parameter_names():
    torch.manual_seed(0)
    params = {"fc1.weight": torch.randn(8, 4), "fc1.bias": torch.zeros(8),
              "fc2.weight": torch.randn(3, 8), "fc2.bias": torch.zeros(3)}

    def step(params, x, y):
        def loss_fn(p):
            h = torch.relu(x @ p["fc1.weight"].T + p["fc1.bias"])
            return F.mse_loss(h @ p["fc2.weight"].T + p["fc2.bias"], y)
        grads, loss = torch.func.grad_and_value(loss_fn)(params)
        for k in params:
            params[k].sub_(0.1 * grads[k])
        return loss

    prog = tkx.capture(step, (params, torch.randn(5, 4), torch.randn(5, 3))).program
    fwd = {op.kind: op.module for op in prog.ops if op.region == "forward"}
    assert fwd["maximum"] == "fc1"  # the relu reads no parameter: the module of its producer
    assert {op.module for op in prog.ops if op.region == "forward" and op.kind == "mm"} == {"fc1", "fc2"}
    bwd = [op for op in prog.ops if op.region == "backward"]
    assert all(op.module is not None for op in bwd) and {op.module for op in bwd} == {"fc1", "fc2"}
    assert next(op for op in bwd if op.kind == "where").module == "fc1"  # relu's backward
    opt = [op for op in prog.ops if op.region == "optimizer"]
    assert len(opt) == 8 and all(op.module == ("fc1" if k < 4 else "fc2") for k, op in enumerate(opt))
    assert dict(prog.modules) == {"fc1": None, "fc2": None}


def test_module_names_from_pytree_paths():
    from tkx.capture.modules import module_of_name
    assert module_of_name("params['blocks.1.attn.qkv.weight']") == "blocks.1.attn.qkv"
    assert module_of_name("params['fc.bias']") == "fc"
    assert module_of_name("params['w1']") is None
    assert module_of_name("x") is None


def test_views_show_modules_next_to_the_source_line():
    step, inputs = gpt_step_inputs(layers=2)
    cg = tkx.capture(step, inputs)
    prog = cg.program
    text = str(prog)
    assert "[blocks.1.attn]" in text and "[blocks.0.ln2]" in text
    assert "[blocks.1.ln1]" in str(cg)  # the captured graph's text
    grouped = prog.pretty(group_by="module")
    heads = [line.strip() for line in grouped.splitlines() if line.startswith("  ") and not line.startswith("    ")]
    n_attn = sum(op.module == "blocks.1.attn" for op in prog.ops)
    assert f"blocks.1.attn (Attention):  # {n_attn} ops" in heads
    assert heads[-2].startswith("outside every module:")
    # every op is listed once, under its module's header
    listed = [line for line in grouped.splitlines() if line.startswith("    %") and " = " in line]
    assert len(listed) == len(prog.ops)
    section = re.split(r"\n  (?! )", grouped.split("  blocks.1.attn (Attention):")[1])[0]
    assert "backward" in section and "forward" in section
    html = prog._repr_mimebundle_()["text/html"]
    assert 'data-tkx-key="mod:blocks.1.attn"' in html
    try:
        prog.pretty(group_by="layer")
    except ValueError as e:
        assert "region, module" in str(e)
    else:
        raise AssertionError("group_by='layer' was accepted")


def test_schedule_and_source_map_carry_modules():
    step, inputs = gpt_step_inputs(layers=2)
    exp = tkx.explore(step, inputs)
    sched = exp.schedule
    text = str(sched)
    assert "[blocks.1.attn" in text and "[blocks.0.mlp.0" in text
    html = sched._repr_mimebundle_()["text/html"]
    assert "mod:blocks.1.attn" in html
    # passes keep the attribution: every scheduled op that came from a module still names it
    captured = {op.id: op.module for op in exp.captured.program.ops}
    assert all(op.module == captured[op.id] for op in sched.program.ops if op.id in captured)
    cuda = exp.cuda
    lines = cuda.module_lines
    assert set(lines) >= {"blocks.0.attn", "blocks.1.attn", "head"}
    ops_at = {n for op in sched.program.ops if op.module == "blocks.1.attn" for n in cuda.op_lines.get(op.id, ())}
    assert set(lines["blocks.1.attn"]) == ops_at
    assert "blocks.1.attn" not in cuda.text  # the kernel text itself is unchanged


class ConvBlock(torch.nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, cout)

    def forward(self, x):
        return F.relu(self.norm(self.conv(x)))


def test_small_cnn_through_functional_call():
    torch.manual_seed(0)
    model = torch.nn.Sequential(ConvBlock(1, 4), ConvBlock(4, 4), torch.nn.Flatten(), torch.nn.Linear(4 * 36, 3))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}

    def step(params, x, y):
        grads, loss = torch.func.grad_and_value(
            lambda p: F.cross_entropy(torch.func.functional_call(model, p, (x,)), y))(params)
        return loss, {k: p - 0.05 * grads[k] for k, p in params.items()}

    prog = tkx.capture(step, (params, torch.randn(2, 1, 6, 6), torch.tensor([0, 2]))).program
    fwd = {op.module for op in prog.ops if op.region == "forward"}
    assert {"0.conv", "0.norm", "1.conv", "1.norm", "3"} <= fwd and "0" in fwd  # the relu: ConvBlock "0" itself
    assert {op.module_type for op in prog.ops if op.module in ("0.conv", "1.conv")} == {"Conv2d"}
    bwd = {op.module for op in prog.ops if op.region == "backward"}
    assert {"0.conv", "1.norm", "3"} <= bwd
    assert {op.module for op in prog.ops if op.region == "optimizer"} == {"0.conv", "0.norm", "1.conv", "1.norm", "3"}
