//! A library without the FLAME symbols is an Err naming the first missing symbol.
use flame::Status;

#[test]
fn library_without_symbols_is_an_error() {
    let e = flame::load_from("libc.so.6").unwrap_err();
    assert_eq!(e.status, Status::LOAD_FAILED);
    assert!(e.message.contains("lacks symbol flame_"), "{}", e.message);
    assert_eq!(flame::version().unwrap_err().status, Status::LOAD_FAILED);
}
