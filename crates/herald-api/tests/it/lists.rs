//! The operator's lists (`/v1/dead`, `/v1/parking`) come a page at a time.

use serde_json::Value;

use crate::{assert_problem, TestApi};

/// Follows `next` from `first` to the end; answers the ids of every page.
async fn pages(api: &TestApi, first: &str, rows: &str) -> Vec<Vec<i64>> {
    let mut out = Vec::new();
    let mut next = Some(first.to_owned());
    while let Some(path) = next {
        let response = api.get(&path).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let page: Value = response.json().await.unwrap();
        out.push(
            page[rows]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| row["id"].as_i64().unwrap())
                .collect(),
        );
        next = page["next"].as_str().map(str::to_owned);
        assert!(out.len() < 20, "the pages never end: {out:?}");
    }
    out
}

#[tokio::test]
async fn dead_rows_and_parked_items_are_listed_a_page_at_a_time() {
    let api = TestApi::default().await;
    let dead = api.dead_rows(5).await;
    // A row that is not DEAD is never listed.
    sqlx::query("INSERT INTO outbox (partition, job_type) VALUES (0, 'send')")
        .execute(&api.pool)
        .await
        .unwrap();
    let parked: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO parking (job_type, raw, reason)
         SELECT 'status', convert_to('{\"n\":' || n || '}', 'UTF8'), 'unknown status'
         FROM generate_series(1, 3) n RETURNING id",
    )
    .fetch_all(&api.pool)
    .await
    .unwrap();

    let dead_pages = pages(&api, "/v1/dead?limit=2", "dead").await;
    assert_eq!(
        dead_pages,
        vec![dead[0..2].to_vec(), dead[2..4].to_vec(), dead[4..].to_vec()]
    );
    let whole = api.get_json("/v1/dead").await;
    assert_eq!(whole["count"], 5);
    assert_eq!(whole["dead"].as_array().unwrap().len(), 5);
    assert!(whole["next"].is_null(), "one page holds them all: {whole}");
    // A page that ends exactly at the last row has no next page.
    assert_eq!(pages(&api, "/v1/dead?limit=5", "dead").await.len(), 1);

    let parked_pages = pages(&api, "/v1/parking?limit=2", "parked").await;
    assert_eq!(
        parked_pages,
        vec![parked[0..2].to_vec(), parked[2..].to_vec()]
    );
    let after = format!("/v1/parking?after={}", parked[2]);
    assert_eq!(pages(&api, &after, "parked").await, vec![Vec::<i64>::new()]);

    for bad in ["/v1/dead?limit=many", "/v1/parking?after=x"] {
        let response = api.get(bad).send().await.unwrap();
        let problem = assert_problem(response, 400, None).await;
        assert!(
            problem["detail"].as_str().unwrap().contains("after"),
            "{problem}"
        );
    }
}
