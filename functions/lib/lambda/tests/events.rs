//! The shared HTTP glue against the repository's API Gateway fixtures: callers, admin
//! claims, route keys and path parameters as API Gateway really sends them.

use flashsale_lambda::caller::{AdminRule, Caller, user_of};
use flashsale_lambda::testing::{ApiEvent, events_dir};
use flashsale_lambda::{ApiError, order_id_param, route_key, sale_id_param};

#[test]
fn the_caller_is_the_jwt_subject_and_a_plain_user_is_no_admin() {
    let req = ApiEvent::fixture("grab.json").into_request();
    let caller = Caller::of(&req, &AdminRule::default()).unwrap();
    assert_eq!(caller.user.as_str(), "user-alice");
    assert!(!caller.is_admin);
    assert_eq!(caller.require_admin().unwrap_err().code(), "forbidden");
}

#[test]
fn an_admin_is_recognised_from_the_group_claim_api_gateway_flattens() {
    let req = ApiEvent::fixture("api-create-sale.json").into_request();
    let caller = Caller::of(&req, &AdminRule::default()).unwrap();
    assert!(caller.is_admin);
    assert!(caller.require_admin().is_ok());
}

#[test]
fn the_admin_claim_and_group_come_from_configuration() {
    let rule = AdminRule {
        claim: "groups".to_owned(),
        group: "sale-admins".to_owned(),
    };
    let json_array = ApiEvent::fixture("grab.json")
        .claim("groups", r#"["staff","sale-admins"]"#)
        .into_request();
    assert!(Caller::of(&json_array, &rule).unwrap().is_admin);

    // The default claim no longer counts once another is configured.
    let cognito_admin = ApiEvent::fixture("api-create-sale.json").into_request();
    assert!(!Caller::of(&cognito_admin, &rule).unwrap().is_admin);
}

#[test]
fn a_request_without_verified_claims_is_unauthorized() {
    let public = ApiEvent::fixture("api-get-sale.json").into_request();
    let err = user_of(&public).unwrap_err();
    assert!(matches!(err, ApiError::Unauthenticated { .. }), "{err:?}");
    assert_eq!(err.status().as_u16(), 401);

    let no_sub = ApiEvent::fixture("grab.json")
        .without_claim("sub")
        .into_request();
    assert_eq!(user_of(&no_sub).unwrap_err().code(), "unauthorized");

    let bad_sub = ApiEvent::fixture("grab.json").user("").into_request();
    let err = user_of(&bad_sub).unwrap_err();
    assert!(matches!(err, ApiError::InvalidSubject { .. }), "{err:?}");
    assert_eq!(err.code(), "unauthorized");
}

#[test]
fn routes_and_path_parameters_come_from_the_route_key() {
    let req = ApiEvent::fixture("api-open-payment.json").into_request();
    assert_eq!(route_key(&req), "POST /orders/{order_id}/payment");
    assert_eq!(
        order_id_param(&req).unwrap().to_string(),
        "phone-launch.01JGZ7T2W6S8M1Q4X9V0B3C5DE"
    );

    let req = ApiEvent::fixture("grab.json")
        .path_param("sale_id", "other-sale")
        .into_request();
    assert_eq!(sale_id_param(&req).unwrap().as_str(), "other-sale");
    assert_eq!(req.uri().path().rsplit('/').nth(2), Some("other-sale"));
}

#[test]
fn a_default_route_matches_no_declared_route() {
    let req = ApiEvent::fixture("api-get-sale.json")
        .route("$default")
        .into_request();
    assert!(!route_key(&req).contains('{'), "{}", route_key(&req));
}

#[test]
fn malformed_ids_in_the_path_are_not_found_not_invalid() {
    let req = ApiEvent::fixture("api-get-order.json")
        .path_param("order_id", "../../etc/passwd")
        .into_request();
    assert_eq!(order_id_param(&req).unwrap_err().code(), "order_not_found");

    let req = ApiEvent::fixture("api-get-sale.json")
        .path_param("sale_id", "a sale with spaces")
        .into_request();
    assert_eq!(sale_id_param(&req).unwrap_err().code(), "sale_not_found");
}

#[test]
fn every_http_fixture_is_a_valid_api_gateway_v2_event_with_its_route() {
    let mut seen = 0;
    for entry in std::fs::read_dir(events_dir()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !(name.starts_with("api-") || name.starts_with("grab")) || !name.ends_with(".json") {
            continue;
        }
        let event = ApiEvent::fixture(&name);
        let declared = event.to_value()["routeKey"].as_str().unwrap().to_owned();
        let req = event.into_request();
        assert_eq!(route_key(&req), declared, "{name}");
        assert_eq!(
            req.method().as_str(),
            declared.split_once(' ').unwrap().0,
            "{name}"
        );
        seen += 1;
    }
    assert!(seen >= 8, "only {seen} HTTP fixtures found");
}
