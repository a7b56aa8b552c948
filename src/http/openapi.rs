//! `GET /openapi.json`: the API's OpenAPI 3.1 document, generated, not written.
//!
//! `utoipa` builds it from the handlers' `#[utoipa::path]` attributes (method,
//! path, parameters, request body, responses; next to the code that answers
//! them) and from the `ToSchema` derives of the very types the handlers
//! deserialize and serialize (`EventView`, `OrderView`, `Problem`, the ids
//! with their charsets as patterns …), so a field added to a type is in the
//! document. What it adds here by hand is what no handler carries: the
//! problem responses ([`problems!`]: each lists its `urn:shardstock:` types,
//! with examples rendered from [`ApiError`] values through the same code that
//! answers them), the bearer scheme of the admin endpoints, the
//! `X-Request-Id` every answer carries ([`RequestIds`]), and the links
//! between operations (create event → purchase → get order → cancel) that a
//! stateful contract tester follows. Every request body refuses unknown
//! members (`deny_unknown_fields`, which `utoipa` writes as
//! `additionalProperties: false`).
//!
//! `utoipa-axum` could also register the routes from the same attributes, but
//! its `routes!` macro pastes `__path_` onto the handler's path, and every
//! handler here is generic over the store (`create::<S>`): the routers stay
//! plain axum (a choice, not tried further under the deadline), and the
//! `api::contract::*::the_document_is_served_and_every_operation_in_it_is_routed`
//! test keeps the two in step.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, ObjectBuilder, OpenApi as Document, Ref, RefOr, Response, ResponseBuilder,
};
use utoipa::{Modify, OpenApi, ToResponse};

use super::error::{ApiError, DrawProblem, PROBLEM_JSON, Problem};
use super::{
    archive, changes, draws, events, live, lookup, ops, orders, purchases, release_orders,
    releases, tokens, webhooks,
};
use crate::domain::token::TokenRefusal;

/// The document's root: every operation, the schemas and responses they use.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "shardstock",
        description = "Segmented hot-stock inventory for flash sales. The prose contract \
                       (semantics, idempotency, ordering) is docs/API.md; this document is \
                       generated from the handlers and types.\n\n\
                       Two different request ids: the idempotency key (a purchase's \
                       `request_id`, or the `Idempotency-Key` header) makes a retry safe, \
                       never buying twice. `X-Request-Id` only correlates log lines: every \
                       answer echoes it (the client's, or one made up), and it does not \
                       deduplicate purchases: the same value sent twice buys twice.",
        license(name = "MIT OR Apache-2.0", identifier = "MIT OR Apache-2.0"),
    ),
    paths(
        events::create, events::list, events::view, events::close, events::reshard,
        events::rebalance, events::audit, archive::archive, tokens::mint,
        tokens::rotate_keys,
        draws::enter, draws::entry, draws::claim_offer, draws::entrants, draws::draw, draws::view,
        live::live, purchases::purchase, orders::order, orders::cancel,
        orders::confirm, lookup::user_orders, lookup::request_answer, changes::changes,
        webhooks::create, webhooks::list, webhooks::view, webhooks::delete, webhooks::resume,
        webhooks::rotate,
        releases::create, releases::list, releases::view, releases::order,
        release_orders::view, release_orders::confirm, release_orders::cancel,
        ops::healthz, ops::readyz, ops::render, ops::ui, openapi_json,
    ),
    components(
        schemas(Problem),
        responses(
            BadRequest, Unauthorized, UnknownEvent, UnknownOrder, UnknownRequest, EventExists,
            PurchaseRefused, TokenRefused, ReshardRefused,
            NotOnSale, TooLarge, NotJson, RateLimited, Unavailable, Internal, NoRoute,
            ConfirmRefused, NoChanges, NoWebhooks, UnknownWebhook, WebhookConflict, UnknownRelease, ReleaseExists, OrderRefused,
            CancelRefused, EntryRefused, NotEntered, NotADraw, DrawRefused, NotDrawn, OfferRefused,
        ),
    ),
    modifiers(&Security, &RequestIds, &Links),
    tags(
        (name = "events", description = "Events: create, view, and the admin operations"),
        (name = "purchases", description = "The hot path"),
        (name = "draws", description = "The `draw` access mode: entries, a verifiable draw, each entrant's standing (docs/API.md, \"Draws\")"),
        (name = "releases", description = "Several pools sold as one: orders of lines, all or nothing"),
        (name = "orders", description = "Lookup, confirm and cancel"),
        (name = "webhooks", description = "Webhook subscriptions: the order changes POSTed, signed (docs/API.md, \"Webhooks\")"),
        (name = "operations", description = "Health, readiness, metrics, the live page, this document"),
    ),
)]
pub(crate) struct ApiDoc;

/// The document as served (built once).
pub fn document() -> &'static str {
    static JSON: LazyLock<String> = LazyLock::new(|| {
        ApiDoc::openapi()
            .to_json()
            .expect("the OpenAPI document serializes")
    });
    &JSON
}

/// This document.
#[utoipa::path(
    get, path = "/openapi.json", tag = "operations", operation_id = "openapi",
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json", body = Object)),
)]
pub(super) async fn openapi_json() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], document())
}

/// A problem response: its description names the types, one example each.
fn problem_response(description: &str, errors: &[ApiError], headers: &[(&str, &str)]) -> Response {
    let types: Vec<String> = errors
        .iter()
        .map(|e| format!("`{}`", e.problem().1.kind))
        .collect();
    let examples = errors.iter().map(|e| {
        let (_, body) = e.problem();
        let slug = body.kind.trim_start_matches("urn:shardstock:").to_owned();
        let value = serde_json::to_value(&body).expect("a problem serializes");
        (slug, ExampleBuilder::new().value(Some(value)).build())
    });
    let content = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("Problem")))
        .examples_from_iter(examples)
        .build();
    let mut response = ResponseBuilder::new()
        .description(format!("{description} ({})", types.join(", ")))
        .content(PROBLEM_JSON, content);
    for (name, description) in headers {
        let schema = if *name == "Retry-After" {
            ObjectBuilder::new().schema_type(utoipa::openapi::schema::Type::Integer)
        } else {
            ObjectBuilder::new().schema_type(utoipa::openapi::schema::Type::String)
        };
        response = response.header(
            *name,
            HeaderBuilder::new()
                .schema(Some(schema))
                .description(Some(*description))
                .build(),
        );
    }
    response.build()
}

const RETRY_AFTER: (&str, &str) = ("Retry-After", "Seconds to wait before retrying");
const OPENS_IN: (&str, &str) = (
    "Retry-After",
    "`not-on-sale` before the sale opens: the seconds until `starts_at` (at least 1)",
);
const CHALLENGE: (&str, &str) = (
    "WWW-Authenticate",
    "`Bearer realm=\"shardstock\"`: the admin endpoints take a bearer token",
);
const REPLAYED: (&str, &str) = (
    "Idempotent-Replayed",
    "`true` when this is the stored answer to an earlier request with the same request id",
);

/// Declares the reusable problem responses (`components.responses`).
macro_rules! problems {
    ($($(#[doc = $doc:literal])* $name:ident => [$($error:expr),+ $(,)?] $(, $header:expr)*;)+) => {$(
        $(#[doc = $doc])*
        pub struct $name;

        impl<'r> ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<Response>) {
                let description = concat!($($doc),*).trim();
                (
                    stringify!($name),
                    problem_response(description, &[$($error),+], &[$($header),*]).into(),
                )
            }
        }
    )+};
}

problems! {
    /// A malformed body or id, a bad field, a quantity out of bounds
    BadRequest => [ApiError::invalid("quantity must be between 1 and 2")];
    /// The admin endpoints need `Authorization: Bearer <token>` (the scheme
    /// in any case); with no admin token configured they are disabled, and
    /// the detail says so
    Unauthorized => [ApiError::Unauthorized, ApiError::AdminDisabled], CHALLENGE;
    /// No such event
    UnknownEvent => [ApiError::UnknownEvent("sneaker-42".into())];
    /// No such event, or order events are off (`[outbox] enabled = false`,
    /// the default): the detail names the setting that turns them on
    NoChanges => [ApiError::UnknownEvent("sneaker-42".into()), ApiError::OrderEventsOff];
    /// Order events are off (`[outbox] enabled = false`, the default): the
    /// detail names the setting that turns them on
    NoWebhooks => [ApiError::OrderEventsOff];
    /// No such webhook subscription, or order events are off
    UnknownWebhook => [ApiError::UnknownWebhook("payments".into()), ApiError::OrderEventsOff];
    /// The id is taken, the subscription is the configuration's (not deleted
    /// here), or the most subscriptions (32) exist
    WebhookConflict => [ApiError::WebhookConflict("webhook subscription \"payments\" exists".into())];
    /// No such order
    UnknownOrder => [ApiError::UnknownOrder("sneaker-42.00a1b2c3d4e5f607.1122334455667788".into())];
    /// No answer is kept for this request id of this user
    UnknownRequest => [ApiError::UnknownRequest("no answer is kept for request id 9f1c-0001 of user u-1001".into())];
    /// The event id is taken
    EventExists => [ApiError::EventExists("sneaker-42".into())];
    /// No such release
    UnknownRelease => [ApiError::UnknownRelease("air-max".into())];
    /// The release id is taken by other settings, or a pool's event id by an event
    ReleaseExists => [ApiError::ReleaseExists("air-max".into()), ApiError::EventExists("air-max.42".into())];
    /// The order is refused, nothing of it kept: `sold-out` names each
    /// short line with its pool's remaining (`short_lines`); a refusal is
    /// stored like a success and replayed
    OrderRefused => [
        ApiError::LinesSoldOut(vec![super::error::ShortLine { pool: "43".into(), quantity: 1, remaining: 0 }]),
        ApiError::LimitExceeded { limit: 2, held: 2 },
        ApiError::NotStarted { event: "air-max".into(), starts_at: 4_102_444_800_000 },
        ApiError::IdempotencyConflict,
    ], REPLAYED, OPENS_IN;
    /// The purchase is refused; a refusal is stored like a success and
    /// replayed. Before the sale opens, `not-on-sale` has `starts_at` and
    /// `Retry-After`
    PurchaseRefused => [
        ApiError::SoldOut { remaining: 1 },
        ApiError::LimitExceeded { limit: 2, held: 2 },
        ApiError::NotStarted { event: "sneaker-42".into(), starts_at: 4_102_444_800_000 },
        ApiError::IdempotencyConflict,
        ApiError::ReleasePool { event: "air-max.42".into(), release: "air-max".into() },
        ApiError::Token(TokenRefusal::Used),
    ], REPLAYED, OPENS_IN;
    /// A `token` event refused the purchase's access token: none sent, not
    /// signed by the event's keys, issued to another user, or expired.
    /// Nothing was bought and nothing is kept under the request id
    TokenRefused => [
        ApiError::Token(TokenRefusal::Missing),
        ApiError::Token(TokenRefusal::Invalid),
        ApiError::Token(TokenRefusal::OtherUser),
        ApiError::Token(TokenRefusal::Expired),
    ];
    /// The order cannot be confirmed: its pay-by deadline passed (its units
    /// are back on sale), it was cancelled, or its event is closed
    ConfirmRefused => [
        ApiError::HoldExpired("sneaker-42.00a1b2c3d4e5f607.1122334455667788".into()),
        ApiError::OrderCancelled("sneaker-42.00a1b2c3d4e5f607.1122334455667788".into()),
        ApiError::NotOnSale("event sneaker-42 is closed".into()),
    ];
    /// A release order cannot be cancelled: it was confirmed (paid) or its
    /// pay-by deadline passed (its units are back on sale)
    CancelRefused => [
        ApiError::OrderConfirmed("air-max.00a1b2c3d4e5f607.1122334455667788".into()),
        ApiError::HoldExpired("air-max.00a1b2c3d4e5f607.1122334455667788".into()),
    ];
    /// The event cannot be resharded: closed, or a pool of a release with
    /// holds
    ReshardRefused => [
        ApiError::NotOnSale("event sneaker-42 is closed".into()),
        ApiError::HeldPool { event: "air-max.42".into(), release: "air-max".into() },
        ApiError::Draw(DrawProblem::WaitingList, "event sneaker-42 is a drawn draw: its bucket count is fixed while its waiting list may hold units".into()),
    ];
    /// The entry is refused: the entry window is over, or the event's
    /// access is not `draw`
    EntryRefused => [
        ApiError::Draw(DrawProblem::EntriesClosed, "entries to the draw of event sneaker-42 are closed".into()),
        ApiError::Draw(DrawProblem::NotADraw, "event sneaker-42 is not a draw: its access is not \"draw\"".into()),
    ];
    /// The user never entered the draw (or no such event)
    NotEntered => [
        ApiError::Draw(DrawProblem::NotEntered, "user u-1001 did not enter the draw of event sneaker-42".into()),
        ApiError::UnknownEvent("sneaker-42".into()),
    ];
    /// The offer cannot be bought: its token is malformed, another user's
    /// or not this event's (403); its deadline passed, it went to the next
    /// user, or there is no such open offer (409)
    OfferRefused => [
        ApiError::Draw(DrawProblem::OfferInvalid, "offer refused at event sneaker-42: the offer token is malformed, another user's or not this event's".into()),
        ApiError::Draw(DrawProblem::OfferExpired, "offer refused at event sneaker-42: the offer's deadline has passed".into()),
        ApiError::Draw(DrawProblem::OfferPassed, "offer refused at event sneaker-42: the offer was passed to the next user in line".into()),
        ApiError::Draw(DrawProblem::NotOffered, "offer refused at event sneaker-42: no such open offer".into()),
        ApiError::NotOnSale("event sneaker-42 is closed".into()),
    ];
    /// The event's access is not `draw`
    NotADraw => [ApiError::Draw(DrawProblem::NotADraw, "event sneaker-42 is not a draw: its access is not \"draw\"".into())];
    /// The draw cannot run before its entries close, or the event's access
    /// is not `draw`
    DrawRefused => [
        ApiError::Draw(DrawProblem::NotDue, "the draw of event sneaker-42 cannot run before its entries close, at 2030-05-01T10:00:00Z".into()),
        ApiError::Draw(DrawProblem::NotADraw, "event sneaker-42 is not a draw: its access is not \"draw\"".into()),
    ];
    /// The entrants are listed once drawn (publishing who entered before is
    /// the operator's choice), or the event's access is not `draw`
    NotDrawn => [
        ApiError::Draw(DrawProblem::NotDrawn, "event sneaker-42 is not drawn yet".into()),
        ApiError::Draw(DrawProblem::NotADraw, "event sneaker-42 is not a draw: its access is not \"draw\"".into()),
    ];
    /// The event is not on sale (before its start, after its end, closed)
    NotOnSale => [ApiError::NotOnSale("event sneaker-42 is closed".into())];
    /// The body is over the limit
    TooLarge => [ApiError::Invalid { status: axum::http::StatusCode::PAYLOAD_TOO_LARGE, detail: "Failed to buffer the request body: length limit exceeded".into() }];
    /// The body is not `application/json`
    NotJson => [ApiError::Invalid { status: axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE, detail: "Expected request with `Content-Type: application/json`".into() }];
    /// Over the configured rate
    RateLimited => [ApiError::RateLimited { retry_after_s: 1 }], RETRY_AFTER;
    /// The store or the database is unreachable (nothing was deducted, or, with
    /// `outcome: unknown`, retry with the same request id), or no decision under
    /// contention or while the layout changes
    Unavailable => [
        ApiError::Unavailable { detail: "the store is unreachable; nothing was deducted".into(), outcome_unknown: false },
        ApiError::TryAgain("the event's layout is changing; retry".into()),
    ], RETRY_AFTER;
    /// A bug: the detail says little, the log says more
    Internal => [ApiError::Internal(String::new())];
    /// Any path outside this document (404), or a method its path does not
    /// have (405); referenced by no operation
    NoRoute => [ApiError::NotFound, ApiError::MethodNotAllowed];
}

/// The bearer scheme of the admin endpoints.
struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The admin token (`[server] admin_token`)"))
                    .build(),
            ),
        );
    }
}

/// `X-Request-Id` on every response: one header in `components.headers`,
/// referenced from each response (the shared problem responses and each
/// operation's own).
struct RequestIds;

/// The name of the header and of its component.
const X_REQUEST_ID: &str = "X-Request-Id";

impl Modify for RequestIds {
    fn modify(&self, doc: &mut Document) {
        let header = HeaderBuilder::new()
            .schema(Some(
                ObjectBuilder::new().schema_type(utoipa::openapi::schema::Type::String),
            ))
            .description(Some(
                "The request's `X-Request-Id` if it is 1 to 128 of `[A-Za-z0-9_.:-]`, else one \
                 made for it: what the request's log lines carry. It correlates logs only and \
                 does not deduplicate purchases (the idempotency key is `request_id` / \
                 `Idempotency-Key`).",
            ))
            .build();
        let reference = || RefOr::Ref(Ref::new(format!("#/components/headers/{X_REQUEST_ID}")));
        let add = |response: &mut RefOr<Response>| {
            if let RefOr::T(response) = response {
                response
                    .headers
                    .insert(X_REQUEST_ID.to_owned(), reference());
            }
        };
        let components = doc.components.get_or_insert_with(Default::default);
        components
            .headers
            .insert(X_REQUEST_ID.to_owned(), RefOr::T(header));
        components.responses.values_mut().for_each(add);
        for item in doc.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for op in operations.into_iter().flatten() {
                op.responses.responses.values_mut().for_each(add);
            }
        }
    }
}

/// Links for stateful testing: create event → purchase → get order → cancel;
/// create event → mint tokens; create release → view it, order from it.
struct Links;

/// (path, method, status, link name, target operation, its `id` from the response).
const LINKS: &[(&str, &str, &str, &str, &str, &str)] = &[
    (
        "/v1/events",
        "post",
        "201",
        "Purchase",
        "purchase",
        "$response.body#/id",
    ),
    (
        "/v1/events",
        "post",
        "201",
        "ViewEvent",
        "view_event",
        "$response.body#/id",
    ),
    (
        "/v1/events",
        "post",
        "201",
        "MintTokens",
        "mint_tokens",
        "$response.body#/id",
    ),
    (
        "/v1/events/{id}/purchases",
        "post",
        "201",
        "GetOrder",
        "get_order",
        "$response.body#/order_id",
    ),
    (
        "/v1/events/{id}/purchases",
        "post",
        "201",
        "CancelOrder",
        "cancel_order",
        "$response.body#/order_id",
    ),
    (
        "/v1/releases",
        "post",
        "201",
        "ViewRelease",
        "view_release",
        "$response.body#/id",
    ),
    (
        "/v1/releases",
        "post",
        "201",
        "OrderRelease",
        "order_release",
        "$response.body#/id",
    ),
    (
        "/v1/releases",
        "post",
        "200",
        "ViewRelease",
        "view_release",
        "$response.body#/id",
    ),
    (
        "/v1/releases",
        "post",
        "200",
        "OrderRelease",
        "order_release",
        "$response.body#/id",
    ),
    (
        "/v1/orders/{id}",
        "get",
        "200",
        "CancelOrder",
        "cancel_order",
        "$response.body#/order_id",
    ),
];

impl Modify for Links {
    fn modify(&self, doc: &mut Document) {
        for &(path, method, status, name, to, id) in LINKS {
            let Some(item) = doc.paths.paths.get_mut(path) else {
                continue;
            };
            let op = match method {
                "post" => item.post.as_mut(),
                _ => item.get.as_mut(),
            };
            let Some(RefOr::T(response)) = op.and_then(|op| op.responses.responses.get_mut(status))
            else {
                continue;
            };
            let link = LinkBuilder::new()
                .operation_id(to)
                .parameter("id", id)
                .build();
            response.links.insert(name.to_owned(), RefOr::T(link));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_urls_pattern_is_the_one_the_service_checks() {
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        let found: Vec<&str> = doc["components"]["schemas"]
            .as_object()
            .unwrap()
            .values()
            .filter_map(|s| s["properties"]["url"]["pattern"].as_str())
            .collect();
        assert!(!found.is_empty(), "no schema with a url pattern");
        for p in found {
            assert_eq!(p, crate::domain::webhook::URL_PATTERN);
        }
    }

    #[test]
    fn a_subscription_may_name_as_many_types_as_the_service_takes() {
        use crate::domain::webhook::CHANGE_TYPES;
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let types = &schemas["CreateWebhook"]["properties"]["types"];
        assert_eq!(types["maxItems"], CHANGE_TYPES.len(), "{types}");
        let named: Vec<&str> = schemas["ChangeType"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(named, CHANGE_TYPES);
    }

    #[test]
    fn the_access_mode_is_one_enum_in_the_create_and_the_view() {
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let access = "#/components/schemas/Access";
        assert_eq!(schemas["EventView"]["properties"]["access"]["$ref"], access);
        assert_eq!(
            schemas["CreateEvent"]["properties"]["access"]["$ref"],
            access
        );
        assert_eq!(
            schemas["Access"]["enum"],
            serde_json::json!(["open", "token", "draw"])
        );
        use crate::domain::token::Access;
        for (mode, name) in [
            (Access::Open, "open"),
            (Access::Token, "token"),
            (Access::Draw, "draw"),
        ] {
            assert_eq!(serde_json::to_value(mode).unwrap(), name);
            assert_eq!(serde_json::from_value::<Access>(name.into()).unwrap(), mode);
        }
    }

    #[test]
    fn the_draw_bounds_in_the_document_are_the_ones_the_service_checks() {
        use crate::domain::draw::{
            MAX_BUY_SECONDS, MAX_ENTRIES_PAGE, MAX_OVERSUBSCRIPTION_MILLI, MIN_BUY_SECONDS,
            MIN_OVERSUBSCRIPTION_MILLI,
        };
        use crate::domain::token::MAX_ALLOWANCE;
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let draw = &schemas["CreateDraw"];
        assert_eq!(draw["additionalProperties"], false);
        let body = &draw["properties"];
        let milli = |v: &serde_json::Value| (v.as_f64().unwrap() * 1000.0).round() as u32;
        assert_eq!(
            milli(&body["oversubscription"]["minimum"]),
            MIN_OVERSUBSCRIPTION_MILLI
        );
        assert_eq!(
            milli(&body["oversubscription"]["maximum"]),
            MAX_OVERSUBSCRIPTION_MILLI
        );
        assert_eq!(body["allowance"]["minimum"], 1);
        assert_eq!(body["allowance"]["maximum"], MAX_ALLOWANCE);
        assert_eq!(body["buy_seconds"]["minimum"], MIN_BUY_SECONDS);
        assert_eq!(body["buy_seconds"]["maximum"], MAX_BUY_SECONDS);
        assert_eq!(
            body["offer_seconds"]["minimum"],
            crate::domain::offer::MIN_OFFER_SECONDS
        );
        assert_eq!(
            body["offer_seconds"]["maximum"],
            crate::domain::offer::MAX_OFFER_SECONDS
        );
        assert_eq!(schemas["Enter"]["additionalProperties"], false);
        let list = &doc["paths"]["/v1/events/{id}/entries"]["get"]["parameters"];
        let limit = list
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "limit")
            .unwrap();
        assert_eq!(limit["schema"]["minimum"], 1);
        assert_eq!(limit["schema"]["maximum"], MAX_ENTRIES_PAGE);
        let op = &doc["paths"]["/v1/events/{id}/draw"]["post"];
        assert_eq!(op["security"], serde_json::json!([{"bearer": []}]));
        let text = document();
        for p in DrawProblem::ALL {
            let slug = p.parts().1;
            assert!(
                text.contains(&format!("urn:shardstock:{slug}")),
                "{slug} missing"
            );
        }
    }

    #[test]
    fn the_mint_bounds_in_the_document_are_the_ones_the_service_checks() {
        use crate::domain::token::{MAX_ALLOWANCE, MAX_EXPIRY_MS, MAX_MINT_USERS, MAX_TOKEN_LEN};
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let mint = &schemas["MintTokens"];
        assert_eq!(mint["additionalProperties"], false);
        let body = &mint["properties"];
        assert_eq!(body["users"]["minItems"], 1);
        assert_eq!(body["users"]["maxItems"], MAX_MINT_USERS);
        assert_eq!(
            body["users"]["items"]["$ref"],
            "#/components/schemas/UserId"
        );
        assert_eq!(body["allowance"]["minimum"], 1);
        assert_eq!(body["allowance"]["maximum"], MAX_ALLOWANCE);
        assert_eq!(body["expires_at_ms"]["maximum"], MAX_EXPIRY_MS);
        let token = &schemas["MintedToken"]["properties"]["token"];
        assert_eq!(token["maxLength"], MAX_TOKEN_LEN);
        let op = &doc["paths"]["/v1/events/{id}/tokens"]["post"];
        assert_eq!(op["security"], serde_json::json!([{"bearer": []}]));
    }

    #[test]
    fn the_document_is_openapi_3_1_and_names_every_problem_type() {
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
        let text = document();
        for slug in [
            "invalid-request",
            "unauthorized",
            "unknown-event",
            "unknown-order",
            "event-exists",
            "sold-out",
            "limit-exceeded",
            "not-on-sale",
            "idempotency-conflict",
            "rate-limited",
            "backend-unavailable",
            "try-again",
            "internal",
        ] {
            assert!(
                text.contains(&format!("urn:shardstock:{slug}")),
                "{slug} missing"
            );
        }
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
        // The bounds written as literals in the attributes are the domain's.
        use crate::domain::model::{MAX_BUCKETS, MAX_PER_ORDER_CAP, MAX_STOCK};
        let create = &doc["components"]["schemas"]["CreateEvent"]["properties"];
        let counts = &doc["components"]["schemas"]["BucketsDoc"]["oneOf"];
        assert_eq!(counts[0]["maximum"], MAX_BUCKETS);
        let range = &doc["components"]["schemas"]["BucketRange"]["properties"];
        assert_eq!(range["max"]["maximum"], MAX_BUCKETS);
        assert_eq!(create["buckets"]["$ref"], "#/components/schemas/BucketsDoc");
        assert_eq!(create["stock"]["maximum"], MAX_STOCK);
        assert_eq!(create["max_per_order"]["maximum"], MAX_PER_ORDER_CAP);
        let reshard = &doc["components"]["schemas"]["Reshard"]["properties"];
        assert_eq!(reshard["buckets"]["maximum"], MAX_BUCKETS);
        // Every link landed on an operation that exists, and names one that exists.
        let ids: Vec<&str> = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|item| item.as_object().unwrap().values())
            .filter_map(|op| op["operationId"].as_str())
            .collect();
        for &(path, method, status, name, to, _) in LINKS {
            let link = &doc["paths"][path][method]["responses"][status]["links"][name];
            assert_eq!(link["operationId"], to, "{path} {method} {status} {name}");
            assert!(ids.contains(&to), "{to} is no operation");
        }
    }
}
