taskset -c 0 ringlock-loadgen --target ringlock://127.0.0.1:24189 --conn-mode per-request --connections 8 --dist private --keys 8 --rate 0 --duration 5s --warmup 1s --key-prefix churn-8-max --json
