taskset -c 0 ringlock-loadgen --target redis://127.0.0.1:24379 --conn-mode persistent --connections 64 --dist hot --keys 1 --rate 2000 --duration 3s --warmup 1s --key-prefix hot-key-64 --json
