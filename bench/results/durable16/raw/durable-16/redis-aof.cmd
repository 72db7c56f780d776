taskset -c 0 ringlock-loadgen --target redis://127.0.0.1:24380 --conn-mode persistent --connections 16 --dist uniform --keys 1000 --rate 2000 --duration 5s --warmup 1s --key-prefix durable-16 --json
