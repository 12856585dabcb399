"""CPU backend against torch on the CPU (µs per call, best of 3, the
threads torch uses): LayerNorm forward/backward and prod, one line per
case. usage: python -m tools.cpu_time"""

import timeit

import torch

import gemsops


def us(fn, n=10):
    fn()
    return min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e6


def layer_norm_rows():
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for m, n in ((4096, 1024), (256, 16384)):
            x = torch.randn(m, n, dtype=dt)
            w, b = torch.randn(n, dtype=dt), torch.randn(n, dtype=dt)
            _, mean, rstd = torch.native_layer_norm(x, (n,), w, b, 1e-5)
            dy = torch.randn_like(x)
            mf, rf = mean.float(), rstd.float()
            t = us(lambda: torch.nn.functional.layer_norm(x, (n,), w, b))
            g = us(lambda: gemsops.layer_norm(x, (n,), w, b))
            tb = us(
                lambda: torch.ops.aten.native_layer_norm_backward(
                    dy, x, (n,), mean, rstd, w, b, (True, True, True)
                )
            )
            gb = us(
                lambda: gemsops.layer_norm_backward(dy, x, (n,), mf, rf, w, b)
            )
            print(
                f"layer_norm {str(dt)[6:]:9s} {m}x{n:<6d} fwd torch {t:6.0f}"
                f" gems {g:6.0f} ({t / g:.2f}x) | bwd torch {tb:6.0f} gems"
                f" {gb:6.0f} ({tb / gb:.2f}x)"
            )


def prod_rows():
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for shape, dim in (
            ((1 << 22,), None),
            ((4096, 1024), 1),
            ((4096, 1024), 0),
            ((64, 4096, 64), 1),
        ):
            x = (torch.rand(shape) * 0.02 + 0.99).to(dt)
            a = () if dim is None else (dim,)
            t = us(lambda: torch.prod(x, *a))
            g = us(lambda: gemsops.prod(x, *a))
            case = "x".join(map(str, shape))
            case += ":all" if dim is None else f":d{dim}"
            print(
                f"prod {str(dt)[6:]:9s} {case:16s} torch {t:6.0f} gems"
                f" {g:6.0f} ({t / g:.2f}x)"
            )


if __name__ == "__main__":
    print(f"threads {torch.get_num_threads()}")
    layer_norm_rows()
    prod_rows()
