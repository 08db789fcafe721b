use super::*;

/// Hand-checked: over `[-m, m]`, `m = max |x|`: `uint8 = trunc(127.5 (x / m + 1))` and
/// `int8 = trunc(127.5 (x / m + 1) - 128)`.
#[test]
fn scalar_quantization_by_hand() {
    // m = 1; 127.5 (x + 1): 0, 63.75, 127.5, 140.25, 191.25, 255.
    let v = [-1.0, -0.5, 0.0, 0.1, 0.5, 1.0];
    assert_eq!(uint8(&v), [0, 63, 127, 140, 191, 255]);
    // minus 128: -128, -64.25, -0.5, 12.25, 63.25, 127; truncated toward 0.
    assert_eq!(int8(&v), [-128, -64, 0, 12, 63, 127]);
    // m = 0.2; 637.5 (x + 0.2): 159.375, 0, 191.25; minus 128: 31.375, -128, 63.25.
    let v = [0.05, -0.2, 0.1];
    assert_eq!(uint8(&v), [159, 0, 191]);
    assert_eq!(int8(&v), [31, -128, 63]);
    // Scaled vectors quantize alike: the range is the vector's own.
    assert_eq!(
        int8(&[-0.5, -0.25, 0.0, 0.05, 0.25, 0.5]),
        [-128, -64, 0, 12, 63, 127]
    );
    // A zero vector: 0 as in any range.
    assert_eq!(
        (uint8(&[0.0; 2]), int8(&[0.0; 2])),
        (vec![127; 2], vec![0; 2])
    );
}

/// Hand-checked: bits `x > 0`, most significant first, padded with 0 bits.
#[test]
fn binary_quantization_by_hand() {
    // 1 0 1 1 0 0 0 1 = 0xB1 = 177; then 1 (0 is not > 0) padded: 1000_0000 = 128.
    let v = [0.3, -0.1, 0.2, 1e-9, 0.0, -0.0, -5.0, 0.7, 0.9, 0.0];
    assert_eq!(ubinary(&v), [177, 128]);
    assert_eq!(binary(&v), [49, 0]);
    assert_eq!(ubinary(&[-1.0; 8]), [0]);
    assert_eq!(binary(&[-1.0; 8]), [-128]);
    assert_eq!(binary(&[1.0; 8]), [127]);
    assert_eq!(ubinary(&[]), Vec::<u8>::new());
}

/// The first vectors of testdata's MiniLM reference, quantized here and by
/// sentence-transformers' formulas (testdata/make-compact-reference.py): equal, value for value.
#[test]
fn equals_sentence_transformers_on_the_reference_vectors() {
    let testdata = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata");
    let read = |name: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(testdata.join(name)).expect("testdata is readable");
        serde_json::from_str(&text).expect("testdata is JSON")
    };
    let reference = read("minilm-reference-embeddings.json");
    let expected = read("compact-reference.json");
    let floats: Vec<Vec<f32>> =
        serde_json::from_value(reference["cases"][0]["embeddings"].clone()).expect("vectors");
    let n = expected["int8"].as_array().expect("an array").len();
    assert_eq!(n, 12);
    for dtype in [Dtype::Int8, Dtype::Uint8, Dtype::Binary, Dtype::Ubinary] {
        let got: Vec<Option<Quantized>> = floats[..n].iter().map(|v| dtype.quantize(v)).collect();
        let got = serde_json::to_value(got).expect("serializes");
        assert_eq!(got, expected[dtype.name()], "{}", dtype.name());
    }
}

#[test]
fn parses_one_type_or_a_list_naming_the_allowed_values() {
    let parse = |json: &str| serde_json::from_str::<OutputDtype>(json);
    assert_eq!(
        parse(r#""int8""#).expect("one"),
        OutputDtype::One(Dtype::Int8)
    );
    assert_eq!(
        parse(r#"["float","ubinary"]"#).expect("a list"),
        OutputDtype::Many(vec![Dtype::Float, Dtype::Ubinary])
    );
    let err = parse(r#""int4""#).expect_err("unknown").to_string();
    assert!(err.contains("`int4`") && err.contains("`ubinary`"), "{err}");
    let err = parse(r#"["int8","base64"]"#)
        .expect_err("unknown")
        .to_string();
    assert!(err.contains("`base64`") && err.contains("`uint8`"), "{err}");
    let err = parse("3").expect_err("a number").to_string();
    assert!(err.contains("one of `float`"), "{err}");
}

#[test]
fn an_empty_list_is_refused() {
    assert_eq!(OutputDtype::One(Dtype::Int8).validate(), Ok(()));
    let err = OutputDtype::Many(Vec::new())
        .validate()
        .expect_err("no type");
    let err = EmbedError::from(err);
    assert_eq!(err.status(), 422);
    assert!(err.to_string().contains("`ubinary`"), "{err}");
}

#[test]
fn reshapes_a_reply() {
    let payload = br#"[[0.5,-0.25,0.0,0.75,0.1,-0.1,0.2,-0.3,0.4],[-1.0,1.0]]"#;
    let one = OutputDtype::One(Dtype::Int8)
        .reshape(payload)
        .expect("int8");
    let first = int8(&[0.5, -0.25, 0.0, 0.75, 0.1, -0.1, 0.2, -0.3, 0.4]);
    let expected = serde_json::to_string(&[first, vec![-128, 127]]).expect("serializes");
    assert_eq!(std::str::from_utf8(&one).expect("UTF-8"), expected);
    let many = OutputDtype::Many(vec![Dtype::Ubinary, Dtype::Float, Dtype::Ubinary]);
    let json: serde_json::Value =
        serde_json::from_slice(&many.reshape(payload).expect("shaped")).expect("JSON");
    // 1 0 0 1 1 0 1 0 = 154, then 1 padded = 128; 0 1 padded = 64.
    assert_eq!(
        json,
        serde_json::json!({"ubinary": [[154, 128], [64]],
                           "float": [[0.5,-0.25,0.0,0.75,0.1,-0.1,0.2,-0.3,0.4],[-1.0,1.0]]})
    );
    let text = String::from_utf8(many.reshape(payload).expect("shaped")).expect("UTF-8");
    assert!(
        text.starts_with(r#"{"ubinary":"#),
        "in the order asked: {text}"
    );
    let err = OutputDtype::One(Dtype::Int8)
        .reshape(b"{}")
        .expect_err("malformed");
    assert_eq!(EmbedError::from(err).status(), 424);
    assert!(OutputDtype::One(Dtype::Float).is_plain());
}

#[test]
fn bytes_are_twos_complement() {
    assert_eq!(
        Quantized::Signed(vec![-1, 0, 127, -128]).to_bytes(),
        [255, 0, 127, 128]
    );
    assert_eq!(Quantized::Unsigned(vec![1, 2]).to_bytes(), [1, 2]);
}
