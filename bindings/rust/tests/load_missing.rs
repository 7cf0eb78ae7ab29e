//! A missing library is an Err, never a panic (own process: the library loads once per process).
use flame::Status;

#[test]
fn missing_library_is_an_error() {
    std::env::set_var("FLAME_LIBRARY", "/nonexistent/libflame.so.1");
    let e = flame::version().unwrap_err();
    assert_eq!(e.status, Status::LOAD_FAILED);
    assert!(e.message.contains("/nonexistent/libflame.so.1"), "{}", e.message);
    // the loader's reason and how to point at the library
    assert!(e.message.contains("No such file"), "{}", e.message);
    assert!(e.message.contains("FLAME_LIBRARY="), "{}", e.message);
    let shown = e.to_string();
    assert!(shown.starts_with("LOAD_FAILED: cannot load the FLAME library"), "{shown}");
    assert_eq!(format!("{e:?}"), shown, "Debug (what main prints) shows the status name too");
    assert_eq!(flame::library_candidates(), vec!["/nonexistent/libflame.so.1".to_string()]);
    let e = flame::Context::new().err().unwrap();
    assert_eq!(e.status, Status::LOAD_FAILED);
    // Later calls report the same failure.
    assert_eq!(flame::abi_version().unwrap_err().status, Status::LOAD_FAILED);
}
