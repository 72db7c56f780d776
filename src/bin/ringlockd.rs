fn main() {
    let mut ring = io_uring::IoUring::new(8).expect("io_uring");
    let nop = io_uring::opcode::Nop::new().build().user_data(7);
    unsafe { ring.submission().push(&nop).unwrap(); }
    ring.submit_and_wait(1).unwrap();
    let c = ring.completion().next().unwrap();
    println!("ok {} {}", c.user_data(), c.result());
}
