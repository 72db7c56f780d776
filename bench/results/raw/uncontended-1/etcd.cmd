taskset -c 0 ringlock-loadgen --target etcd://127.0.0.1:24390 --conn-mode per-request --connections 1 --dist private --keys 1 --rate 1000 --duration 5s --warmup 1s --key-prefix uncontended-1 --json
