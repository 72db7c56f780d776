taskset -c 0 ringlock-loadgen --target ringlock://127.0.0.1:24189 --conn-mode persistent --connections 64 --dist hot --keys 1 --rate 2000 --duration 5s --warmup 1s --key-prefix hot-key-64 --json
